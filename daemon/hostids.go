package daemon

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/userns"
)

// restrictSandboxesDir makes dir root:<sandbox root's host gid> 0710: a
// directory that holds sandboxes' files with their sandbox modes (/tmp is
// 1777, home files 0644), whose paths /proc/mounts tells every host user.
// With 0711 any local user could read a sandbox's files or drop files into
// its /tmp. Only the sandboxes themselves need to pass through here (runc
// sets up their mounts as the sandbox's root, whose host gid is the
// group), and root.
func restrictSandboxesDir(dir string, shift storage.IDShift) error {
	if err := os.Chown(dir, 0, shift.GID(storage.RootUID)); err != nil {
		return err
	}
	return os.Chmod(dir, 0o710)
}

// idSpan is a run of host ids sandboxes use: first..first+size-1.
type idSpan struct {
	what        string
	first, size uint64
}

// sandboxIDSpans are the host ids sandboxes run as or own files as: the
// storage ids (files of templates and layers on disk, and the sandboxes of
// drivers without an identity of their own) and the slices of
// userns.DefaultRange.
func sandboxIDSpans() []idSpan {
	shift := storage.DefaultIDShift
	r := userns.DefaultRange
	return []idSpan{
		{"the storage ids", uint64(shift.UIDBase), uint64(shift.Size)},
		{"the sandboxes' id slices", uint64(r.Base), r.End() - uint64(r.Base)},
	}
}

// checkIDRanges refuses to run when host accounts may use ids in spans. A
// host user who owns one of them -- an account with that uid or gid, or a
// subordinate range in /etc/subuid or /etc/subgid (useradd hands out
// 100000:65536 to the first user, for rootless containers) -- could act as
// root of a sandbox: read and write its files and ptrace its processes.
// subuid and subgid are name:first:count lines; passwd and group have the
// id in the third field. Missing files are fine.
func checkIDRanges(spans []idSpan, subuid, subgid, passwd, group string) error {
	for _, c := range []struct {
		file   string
		ranges bool // name:first:count; else an id in field 3
	}{{subuid, true}, {subgid, true}, {passwd, false}, {group, false}} {
		if c.file == "" {
			continue
		}
		if err := checkIDFile(c.file, c.ranges, spans); err != nil {
			return err
		}
	}
	return nil
}

func checkIDFile(file string, ranges bool, spans []idSpan) error {
	f, err := os.Open(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Split(line, ":")
		if len(fields) < 3 {
			continue
		}
		var first, size uint64
		var err1, err2 error
		if ranges {
			first, err1 = strconv.ParseUint(fields[1], 10, 32)
			size, err2 = strconv.ParseUint(fields[2], 10, 32)
		} else {
			first, err1 = strconv.ParseUint(fields[2], 10, 32)
			size = 1
		}
		if err1 != nil || err2 != nil || size == 0 {
			continue
		}
		for _, s := range spans {
			if first < s.first+s.size && s.first < first+size {
				return fmt.Errorf("%s gives %q ids %d-%d, which overlap %s (%d-%d): "+
					"that account could act as root of a sandbox; give it ids outside that range",
					file, fields[0], first, first+size-1, s.what, s.first, s.first+s.size-1)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read %s: %w", filepath.Base(file), err)
	}
	return nil
}

// checkTraversable fails when a directory above the data directory dir
// does not let every user pass (o+x). runc sets up a sandbox's mounts as
// the sandbox's root, an unprivileged host id in no group of the host, so
// it must walk from / to the sandbox's files: under a 0700 directory (such
// as /root) every create would fail with a bare "permission denied".
func checkTraversable(dir string) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	for p := filepath.Dir(real); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if fi.Mode().Perm()&0o001 == 0 {
			return fmt.Errorf("data directory %s is under %s (mode %04o), which sandboxes cannot pass through: "+
				"they run as unprivileged host ids and need execute permission for others on every directory above "+
				"the data directory; choose a data directory elsewhere (the default is %s) or chmod o+x %s",
				dir, p, fi.Mode().Perm(), defaults.DataDir, p)
		}
		if p == "/" {
			return nil
		}
	}
}
