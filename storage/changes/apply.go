package changes

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// Journal states (journal.json in a merge's directory). A directory
// without a journal was still being staged: nothing was applied, and it
// is discarded.
const (
	stateApplying = "applying"
	stateRollback = "rollback"
)

// journal is a merge's durable record: its state and ops with what each
// path held before (Op.Had, Op.Backup).
type journal struct {
	State string `json:"state"`
	Ops   []Op   `json:"ops"`
}

func journalPath(dir string) string { return filepath.Join(dir, "journal.json") }

// writeJournal writes j into dir, synced (storage.WriteJSON).
func writeJournal(dir string, j *journal) error {
	return storage.WriteJSON(journalPath(dir), j, 0o600)
}

// Apply makes plan's ops happen in target, all or nothing, using dir (a
// new directory outside the target's tree, on any filesystem) as its
// journal: it stages every new file's content (from theirs or the
// merged text) and a backup of every entry of target it replaces or
// removes, records the ops in dir/journal.json (written and synced
// before the first change), applies them in order and, when one fails
// (a full disk, the sandbox's quota), restores the backups in reverse
// order before returning the error. The caller keeps the sandbox frozen
// meanwhile. A process that dies midway leaves the journal, which
// Recover finishes (or undoes) at the next start; dir is removed once
// done. Every change in target goes through a directory descriptor
// resolved beneath its root without following a symlink, and final
// names are replaced by rename, never written through.
func Apply(ctx context.Context, target, theirs *Tree, ops []Op, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	j := &journal{State: stateApplying, Ops: ops}
	if err := stage(target, theirs, j, dir); err != nil {
		os.RemoveAll(dir)
		return err
	}
	if err := writeJournal(dir, j); err != nil {
		os.RemoveAll(dir)
		return err
	}
	return run(target, j, dir)
}

// Recover finishes the merge journaled in dir on target (whose tree the
// caller opened, with the sandbox frozen): a journal still applying is
// applied again from its first op (every op is idempotent) and undone if
// that fails; one rolling back is rolled back; a directory without a
// journal is discarded. dir is removed after. A target that is gone
// (nil) only discards dir.
func Recover(target *Tree, dir string) error {
	var j journal
	err := storage.ReadJSON(journalPath(dir), &j, "merge journal")
	if errors.Is(err, errdefs.ErrNotFound) || target == nil {
		return os.RemoveAll(dir)
	}
	if err != nil {
		return err
	}
	if j.State == stateRollback {
		if err := rollback(target, &j, dir); err != nil {
			return err
		}
		return os.RemoveAll(dir)
	}
	return run(target, &j, dir)
}

// run applies j's ops; on failure it rolls back. dir is removed when the
// target is consistent again.
func run(target *Tree, j *journal, dir string) error {
	for _, op := range j.Ops {
		if err := apply(target, dir, op); err != nil {
			aerr := fmt.Errorf("merge %q: %w", "/"+op.Path, err)
			if errors.Is(err, unix.EDQUOT) || errors.Is(err, unix.ENOSPC) {
				aerr = errdefs.Newf(errdefs.ErrInsufficientStorage,
					"merge %q: the session's disk is full (its disk limit or the volume); the merge was rolled back", "/"+op.Path)
			}
			j.State = stateRollback
			if werr := writeJournal(dir, j); werr != nil {
				return errors.Join(aerr, werr)
			}
			if rerr := rollback(target, j, dir); rerr != nil {
				return errors.Join(aerr, fmt.Errorf("roll back (the journal stays for the next start): %w", rerr))
			}
			os.RemoveAll(dir)
			return aerr
		}
	}
	if err := syncTree(target); err != nil {
		return err
	}
	return os.RemoveAll(dir)
}

// rollback restores, in reverse order, what every op's path held.
func rollback(target *Tree, j *journal, dir string) error {
	for i := len(j.Ops) - 1; i >= 0; i-- {
		op := j.Ops[i]
		var err error
		if op.Had == nil {
			err = apply(target, dir, Op{Path: op.Path, Action: ActDelete})
		} else {
			h := op.Had
			undo := Op{Path: op.Path, Mode: h.Mode, UID: h.UID, GID: h.GID, Staged: op.Backup, Target: h.Target}
			switch h.Kind {
			case KindFile:
				undo.Action = ActWrite
			case KindSymlink:
				undo.Action = ActSymlink
			default:
				undo.Action = ActMkdir
			}
			err = apply(target, dir, undo)
		}
		if err != nil {
			return fmt.Errorf("restore %q: %w", "/"+op.Path, err)
		}
	}
	return syncTree(target)
}

// stage writes the new contents and the backups into dir and fills in
// the ops' Staged, Had and Backup.
func stage(target, theirs *Tree, j *journal, dir string) error {
	for i := range j.Ops {
		op := &j.Ops[i]
		had, ok, err := target.Lstat(op.Path)
		if err != nil {
			return err
		}
		if ok {
			if had.Kind == KindOther {
				return errdefs.Newf(errdefs.ErrInvalidArgument, "%q is a special file (device, FIFO or socket), which a merge does not replace", "/"+op.Path)
			}
			op.Had = &had
			if had.Kind == KindFile {
				op.Backup = "b-" + strconv.Itoa(i)
				if err := copyOut(target, op.Path, filepath.Join(dir, op.Backup)); err != nil {
					return err
				}
			}
		}
		if op.Action != ActWrite {
			continue
		}
		op.Staged = "s-" + strconv.Itoa(i)
		if op.Data != nil {
			if err := storage.WriteFileSynced(filepath.Join(dir, op.Staged), op.Data); err != nil {
				return err
			}
		} else if err := copyOut(theirs, op.Path, filepath.Join(dir, op.Staged)); err != nil {
			return err
		}
	}
	return nil
}

// copyOut copies regular file rel of t to dst (a new file), synced.
func copyOut(t *Tree, rel, dst string) error {
	src, err := t.Open(rel)
	if err != nil {
		return err
	}
	defer src.Close()
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// syncTree flushes the target's filesystem (syncfs), so an applied merge
// is on disk before its journal goes.
func syncTree(t *Tree) error {
	return unix.Syncfs(t.fd)
}

// tmpName is the name an op's new entry is made under before the rename.
const tmpName = ".forkbox-merge.tmp"

// apply makes op happen in target (idempotent: applying it again leaves
// the same result).
func apply(target *Tree, dir string, op Op) error {
	pdir, name := split(op.Path)
	dfd, err := target.OpenDir(pdir, true)
	if err != nil {
		if op.Action == ActDelete && (err == unix.ENOENT || err == unix.ENOTDIR) {
			return nil
		}
		return fmt.Errorf("open parent: %w", err)
	}
	defer unix.Close(dfd)
	_ = unix.Unlinkat(dfd, tmpName, 0) // left by an interrupted op
	switch op.Action {
	case ActDelete:
		return remove(dfd, name)
	case ActMkdir:
		var st unix.Stat_t
		err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if err == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			if err := unix.Unlinkat(dfd, name, 0); err != nil {
				return err
			}
			err = unix.ENOENT
		}
		if err == unix.ENOENT {
			if err := unix.Mkdirat(dfd, name, 0o700); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		fd, err := unix.Openat(dfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Fchown(fd, int(op.UID), int(op.GID)); err != nil {
			return err
		}
		return unix.Fchmod(fd, op.Mode)
	case ActSymlink:
		if err := unix.Symlinkat(op.Target, dfd, tmpName); err != nil {
			return err
		}
		if err := unix.Fchownat(dfd, tmpName, int(op.UID), int(op.GID), unix.AT_SYMLINK_NOFOLLOW); err != nil {
			unix.Unlinkat(dfd, tmpName, 0)
			return err
		}
		return replace(dfd, name)
	case ActWrite:
		src, err := os.Open(filepath.Join(dir, op.Staged))
		if err != nil {
			return fmt.Errorf("staged content: %w", err)
		}
		defer src.Close()
		fd, err := unix.Openat(dfd, tmpName, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), tmpName)
		_, err = io.Copy(f, src)
		if err == nil {
			err = f.Chown(int(op.UID), int(op.GID))
		}
		if err == nil {
			err = unix.Fchmod(fd, op.Mode) // after the chown, which clears setuid
		}
		if err == nil {
			err = f.Sync()
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			unix.Unlinkat(dfd, tmpName, 0)
			return err
		}
		return replace(dfd, name)
	}
	return fmt.Errorf("unknown merge action %q", op.Action)
}

// replace renames tmpName over name in dfd, removing an empty directory
// there first.
func replace(dfd int, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(dfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if err := unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR); err != nil {
			unix.Unlinkat(dfd, tmpName, 0)
			return err
		}
	}
	if err := unix.Renameat(dfd, tmpName, dfd, name); err != nil {
		unix.Unlinkat(dfd, tmpName, 0)
		return err
	}
	return nil
}

// remove removes name from dfd (a directory once empty); a missing name
// is not an error.
func remove(dfd int, name string) error {
	err := unix.Unlinkat(dfd, name, 0)
	if err == unix.EISDIR || err == unix.EPERM {
		err = unix.Unlinkat(dfd, name, unix.AT_REMOVEDIR)
	}
	if err == unix.ENOENT {
		return nil
	}
	return err
}
