package storage

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRemoveTree removes a mixed tree (files, empty and nested directories,
// symlinks, names like the ones it uses for moved entries) without
// following symlinks out of it.
func TestRemoveTree(t *testing.T) {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	if err := os.MkdirAll(filepath.Join(outside, "keep"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outside, "keep", "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(base, "tree")
	for _, d := range []string{"a/b/c/d", "a/.forkbox-rm-1/x", ".forkbox-rm-2", "empty", "e/f"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"top", "a/f", "a/b/c/d/deep", "a/.forkbox-rm-1/x/y", "e/f/g"} {
		if err := os.WriteFile(filepath.Join(root, f), []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(root, "a/b/link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("keep", filepath.Join(root, "rel")); err != nil {
		t.Fatal(err)
	}
	if err := RemoveTree(root); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("tree still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "keep", "f")); err != nil {
		t.Fatalf("a symlink was followed out of the tree: %v", err)
	}
	if err := RemoveTree(root); err != nil {
		t.Fatalf("removing a missing tree: %v", err)
	}
	link := filepath.Join(base, "link")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	if err := RemoveTree(link); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(outside, "keep", "f")); err != nil {
		t.Fatalf("RemoveTree of a symlink removed its target: %v", err)
	}
}

// TestRemoveTreeDeeperThanFileLimit removes a directory chain far deeper
// than the open-files limit, which os.RemoveAll cannot (it holds one
// descriptor per level): what a sandbox leaves in its writable layer with
// `mkdir d; cd d` in a loop.
func TestRemoveTreeDeeperThanFileLimit(t *testing.T) {
	const limit, depth = 64, 1000
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old); err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "deep")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < depth; i++ {
		if err := unix.Mkdirat(fd, "d", 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := unix.Openat(fd, "d", unix.O_RDONLY|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		unix.Close(fd)
		fd = next
	}
	if err := unix.Mknodat(fd, "leaf", unix.S_IFREG|0o644, 0); err != nil {
		t.Fatal(err)
	}
	unix.Close(fd)

	lowered := old
	lowered.Cur = limit
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lowered); err != nil {
		t.Fatal(err)
	}
	err = RemoveTree(root)
	if rerr := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old); rerr != nil {
		t.Fatal(rerr)
	}
	if err != nil {
		t.Fatalf("RemoveTree of a %d-deep tree with %d open files allowed: %v", depth, limit, err)
	}
	if _, err := os.Lstat(root); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("tree still there: %v", err)
	}
}
