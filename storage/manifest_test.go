package storage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// recordedManifestDigest is ManifestDigest as it was before the walk
// streamed (collect every line, sort, hash), kept verbatim as the
// reference for the digests existing databases and snapshots hold.
func recordedManifestDigest(root string) (string, error) {
	type line struct{ path, rest string }
	var lines []line
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			return err
		}
		target := ""
		if st.Mode&syscall.S_IFMT == syscall.S_IFLNK {
			if target, err = os.Readlink(p); err != nil {
				return err
			}
		}
		size := st.Size
		if st.Mode&syscall.S_IFMT == syscall.S_IFDIR {
			size = 0 // directory sizes vary by filesystem and history
		}
		lines = append(lines, line{rel, fmt.Sprintf("%o\x00%d\x00%d\x00%d\x00%d\x00%s\x00%d\x00%d",
			st.Mode, st.Uid, st.Gid, size, st.Rdev, target,
			st.Mtim.Nano(), st.Ctim.Nano())})
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("manifest of %s: %w", root, err)
	}
	sort.Slice(lines, func(i, j int) bool { return lines[i].path < lines[j].path })
	h := sha256.New()
	for _, l := range lines {
		fmt.Fprintf(h, "%s\x00%s\n", l.path, l.rest)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// TestManifestDigestCompatible proves the streaming walk gives the digest
// the recorded format gives, on trees whose names sort differently as
// whole paths than directory by directory (bytes below '/' such as '-',
// '.', ' ', '!' and control bytes; names that sort before the root's
// "."), with every entry type, and on random trees.
func TestManifestDigestCompatible(t *testing.T) {
	root := t.TempDir()
	mk := func(rel string) {
		if err := os.MkdirAll(filepath.Join(root, rel), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	wr := func(rel, data string) {
		if err := os.WriteFile(filepath.Join(root, rel), []byte(data), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"a/b/c", "a-b", "a.b/x", "a b", "ab", "a!/z", "-top", "\x01ctl/d", "é/ü", ".git/objects", "a/-/+"} {
		mk(d)
	}
	for _, f := range []string{"a/b/c/file", "a/b.txt", "a/b-1", "a-c", "a.", "a/b/c-", "!bang", " space", ".hidden", "a/-/+/f", "\x7fdel"} {
		wr(f, f)
	}
	for link, target := range map[string]string{"ln-dir": "a", "a/b/dangling": "/nowhere", "a/self": "."} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Link(filepath.Join(root, "a-c"), filepath.Join(root, "a/hard")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(root, "a/fifo"), 0o600); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		// An overlay whiteout: a 0:0 character device.
		if err := syscall.Mknod(filepath.Join(root, "a/b/wh"), syscall.S_IFCHR|0o600, 0); err != nil {
			t.Fatal(err)
		}
	}
	same(t, root)

	rng := rand.New(rand.NewSource(13))
	alphabet := []byte("ab-._ !0\x01z")
	for i := 0; i < 20; i++ {
		r := t.TempDir()
		for j := 0; j < 80; j++ {
			depth := 1 + rng.Intn(4)
			var parts []string
			for k := 0; k < depth; k++ {
				n := 1 + rng.Intn(3)
				b := make([]byte, n)
				for x := range b {
					b[x] = alphabet[rng.Intn(len(alphabet))]
				}
				parts = append(parts, string(b))
			}
			p := filepath.Join(append([]string{r}, parts...)...)
			if rng.Intn(2) == 0 {
				os.MkdirAll(p, 0o755)
			} else if os.MkdirAll(filepath.Dir(p), 0o755) == nil {
				os.WriteFile(p, nil, 0o644) // fails harmlessly where p is a directory
			}
		}
		same(t, r)
	}
}

// same fails t unless both walks agree on root.
func same(t *testing.T, root string) {
	t.Helper()
	want, err := recordedManifestDigest(root)
	if err != nil {
		t.Fatal(err)
	}
	got, n, err := ManifestDigest(context.Background(), root, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("streaming digest %s, recorded format %s (tree %s, %d entries)", got, want, root, n)
	}
}

// TestManifestDigestBounds proves the walk counts entries, stops past
// maxEntries and past MaxManifestDepth with a resource-exhausted error
// naming the limit, and honours cancellation.
func TestManifestDigestBounds(t *testing.T) {
	root := t.TempDir()
	for i := 0; i < 9; i++ {
		if err := os.WriteFile(filepath.Join(root, fmt.Sprint("f", i)), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	before := DigestedEntries()
	if _, n, err := ManifestDigest(context.Background(), root, 10); err != nil || n != 10 {
		t.Fatalf("10 entries under a limit of 10: %d %v", n, err)
	}
	if d := DigestedEntries() - before; d != 10 {
		t.Fatalf("DigestedEntries grew by %d, want 10", d)
	}
	_, _, err := ManifestDigest(context.Background(), root, 9)
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "more than 9 entries") {
		t.Fatalf("10 entries under a limit of 9: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	many := t.TempDir()
	for i := 0; i < 5000; i++ {
		os.WriteFile(filepath.Join(many, fmt.Sprint(i)), nil, 0o644)
	}
	if _, _, err := ManifestDigest(ctx, many, 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled walk: %v", err)
	}

	deep := t.TempDir()
	fd, err := syscall.Open(deep, syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < MaxManifestDepth+1; i++ {
		if err := syscall.Mkdirat(fd, "d", 0o755); err != nil {
			t.Fatal(err)
		}
		next, err := syscall.Openat(fd, "d", syscall.O_RDONLY|syscall.O_DIRECTORY, 0)
		syscall.Close(fd)
		if err != nil {
			t.Fatal(err)
		}
		fd = next
	}
	syscall.Close(fd)
	_, _, err = ManifestDigest(context.Background(), deep, 0)
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "deeper than") {
		t.Fatalf("a tree %d levels deep: %v", MaxManifestDepth+1, err)
	}
	if err := RemoveTree(deep); err != nil {
		t.Fatal(err)
	}
}
