package agent

import (
	"bytes"
	"fmt"
	"os/user"
	"strconv"
	"sync"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
)

// account is a resolved user: who a process runs as and who owns files the
// agent writes for it. An account that lookup returns is shared: it is
// never modified.
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

// The account databases lookupAccount reads (os/user's pure-Go lookup).
const (
	passwdFile = "/etc/passwd"
	groupFile  = "/etc/group"
)

// maxCachedDB is the largest account database (in bytes) whose lookups
// are cached; a bigger one is read and parsed on every lookup.
const maxCachedDB = 1 << 20

// accountCache remembers the accounts lookupAccount resolved, for as long
// as /etc/passwd and /etc/group hold exactly the bytes they were resolved
// from. Every lookup reads both files again (a few syscalls, no parsing)
// and compares them with what the cached entries came from: any change to
// either (in place, by rename, of the same size or within the same
// timestamp tick) drops every entry. An entry is only kept when the files
// read the same before and after its lookup (a change and its undoing in
// between cannot be told apart; only the sandbox's own root can write
// these files, and in the runc tier's read-only root not even it). It is
// safe for concurrent use.
type accountCache struct {
	mu            sync.Mutex
	passwd, group []byte // what the entries were resolved from; nil: no entries
	byName        map[string]*account
}

// lookup is lookupAccount(name), answered from the cache when the
// account databases have not changed since name was resolved.
func (c *accountCache) lookup(name string) (*account, error) {
	passwd, okP := readAccountDB(passwdFile)
	group, okG := readAccountDB(groupFile)
	if !okP || !okG {
		return lookupAccount(name)
	}
	c.mu.Lock()
	if c.byName != nil && bytes.Equal(passwd, c.passwd) && bytes.Equal(group, c.group) {
		if acc, ok := c.byName[name]; ok {
			c.mu.Unlock()
			return acc, nil
		}
	}
	c.mu.Unlock()
	acc, err := lookupAccount(name)
	if err != nil {
		return nil, err
	}
	passwd2, okP := readAccountDB(passwdFile)
	group2, okG := readAccountDB(groupFile)
	if !okP || !okG || !bytes.Equal(passwd, passwd2) || !bytes.Equal(group, group2) {
		return acc, nil // changed meanwhile: answered, not kept
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byName == nil || !bytes.Equal(passwd, c.passwd) || !bytes.Equal(group, c.group) {
		c.passwd, c.group, c.byName = passwd, group, map[string]*account{}
	}
	c.byName[name] = acc
	return acc, nil
}

// readAccountDB returns the contents of account database path, without
// following the Go runtime's poller path for it (an open, a stat, the
// reads and a close). A missing file reads as empty (lookupAccount then
// falls back to its defaults). ok is false when the file cannot be
// cached: it is not a regular file, is over maxCachedDB or cannot be
// read; the caller then looks up without the cache.
func readAccountDB(path string) (b []byte, ok bool) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err == unix.ENOENT {
		return []byte{}, true
	}
	if err != nil {
		return nil, false
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size > maxCachedDB {
		return nil, false
	}
	b = make([]byte, 0, st.Size+1)
	for {
		if len(b) == cap(b) {
			if len(b) > maxCachedDB {
				return nil, false
			}
			b = append(b, 0)[:len(b)]
		}
		n, err := unix.Read(fd, b[len(b):cap(b)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, false
		}
		if n == 0 {
			return b, true
		}
		b = b[:len(b)+n]
	}
}
