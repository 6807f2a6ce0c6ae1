package agent

import (
	"fmt"
	"os/user"
	"strconv"

	"connectrpc.com/connect"
)

// account is a resolved user: who a process runs as and who owns files the
// agent writes for it.
type account struct {
	Name   string
	UID    uint32
	GID    uint32
	Groups []uint32
	Home   string
}

// lookupAccount resolves name through the sandbox's /etc/passwd and
// /etc/group. A name missing from passwd still resolves when it is "root"
// (uid 0, /root), "user" (uid 1000, /home/user, the default sandbox user)
// or a number, so imported images without those entries work. Anything else
// is an unauthenticated error, as in envd.
func lookupAccount(name string) (*account, error) {
	if u, err := user.Lookup(name); err == nil {
		return accountFromUser(u)
	}
	if n, err := strconv.ParseUint(name, 10, 32); err == nil {
		if u, err := user.LookupId(name); err == nil {
			return accountFromUser(u)
		}
		return &account{Name: name, UID: uint32(n), GID: uint32(n), Home: "/"}, nil
	}
	switch name {
	case "root":
		return &account{Name: "root", UID: 0, GID: 0, Home: "/root"}, nil
	case "user":
		return &account{Name: "user", UID: 1000, GID: 1000, Home: "/home/user"}, nil
	}
	return nil, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("unknown user %q", name))
}

func accountFromUser(u *user.User) (*account, error) {
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: bad uid %q", u.Username, u.Uid)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %s: bad gid %q", u.Username, u.Gid)
	}
	acc := &account{Name: u.Username, UID: uint32(uid), GID: uint32(gid), Home: u.HomeDir}
	if acc.Home == "" {
		acc.Home = "/"
	}
	if ids, err := u.GroupIds(); err == nil {
		for _, s := range ids {
			if g, err := strconv.ParseUint(s, 10, 32); err == nil && uint32(g) != acc.GID {
				acc.Groups = append(acc.Groups, uint32(g))
			}
		}
	}
	return acc, nil
}
