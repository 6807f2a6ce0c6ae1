package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/forkbox/forkbox/storage"
)

// restrictSandboxesDir makes DATA/sandboxes root:<sandbox root's host gid>
// 0710. Each sandbox's writable layer lives under it (upper/ holds the
// sandbox's files with their sandbox modes: /tmp is 1777, home files 0644),
// and the overlay mounts in /proc/mounts tell every host user the exact
// paths: with 0711 any local user could read a sandbox's files or drop
// files into its /tmp. Only the sandboxes themselves need to pass through
// here (runc sets up their mounts as the sandbox's root, whose host gid is
// the group), and root.
func restrictSandboxesDir(dir string, shift storage.IDShift) error {
	if err := os.Chown(dir, 0, shift.GID(storage.RootUID)); err != nil {
		return err
	}
	return os.Chmod(dir, 0o710)
}

// checkIDRange refuses to run when host accounts may use ids in the range
// sandboxes map to. Every sandbox's root and user are the same host ids
// (storage.IDShift), so a host user who owns one of them -- an account with
// that uid or gid, or a subordinate range in /etc/subuid or /etc/subgid
// (useradd hands out 100000:65536 to the first user, for rootless
// containers) -- could become root of every sandbox: read and write all
// their files and ptrace their processes. subuid and subgid are
// name:first:count lines; passwd and group have the id in the third field.
// Missing files are fine.
func checkIDRange(shift storage.IDShift, subuid, subgid, passwd, group string) error {
	type span struct {
		file        string
		first, size uint64
	}
	uids := span{first: uint64(shift.UIDBase), size: uint64(shift.Size)}
	gids := span{first: uint64(shift.GIDBase), size: uint64(shift.Size)}
	for _, c := range []struct {
		file   string
		want   span
		ranges bool // name:first:count; else an id in field 3
	}{{subuid, uids, true}, {subgid, gids, true}, {passwd, uids, false}, {group, gids, false}} {
		if c.file == "" {
			continue
		}
		f, err := os.Open(c.file)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return err
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			fields := strings.Split(line, ":")
			var first, size uint64
			var err1, err2 error
			if c.ranges {
				if len(fields) < 3 {
					continue
				}
				first, err1 = strconv.ParseUint(fields[1], 10, 32)
				size, err2 = strconv.ParseUint(fields[2], 10, 32)
			} else {
				if len(fields) < 3 {
					continue
				}
				first, err1 = strconv.ParseUint(fields[2], 10, 32)
				size = 1
			}
			if err1 != nil || err2 != nil || size == 0 {
				continue
			}
			if first < c.want.first+c.want.size && c.want.first < first+size {
				f.Close()
				return fmt.Errorf("%s gives %q ids %d-%d, which overlap the ids sandboxes run as on this host (%d-%d): "+
					"that account could act as root of every sandbox; give it ids outside that range",
					c.file, fields[0], first, first+size-1, c.want.first, c.want.first+c.want.size-1)
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return fmt.Errorf("read %s: %w", filepath.Base(c.file), err)
		}
	}
	return nil
}
