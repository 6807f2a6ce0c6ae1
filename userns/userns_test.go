package userns

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// TestClaimsAreExclusive: parallel claims of two owners sharing one
// directory never get the same slice; a full range is ErrUnavailable;
// each owner releases and sweeps only its own claims, and a reopened
// Claims knows its owner's slices.
func TestClaimsAreExclusive(t *testing.T) {
	dir := t.TempDir()
	rng := Range{Base: 1 << 30, Slices: 16}
	a, err := OpenClaims(dir, rng, "/data/a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := OpenClaims(dir, rng, "/data/b")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[uint32]string{}
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		for _, c := range []*Claims{a, b} {
			wg.Add(1)
			go func(c *Claims, id string) {
				defer wg.Done()
				s, err := c.Claim(id)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				if other, dup := seen[s.First]; dup {
					t.Errorf("slice %d given to %s and %s", s.First, other, id)
				}
				seen[s.First] = id
			}(c, fmt.Sprintf("sb%d%s", i, c.owner[len(c.owner)-1:]))
		}
	}
	wg.Wait()
	if _, err := a.Claim("onemore"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("claim past a full range: %v, want unavailable", err)
	}
	if s1, _ := a.Claim("sb0a"); s1 != mustLookup(t, a, "sb0a") {
		t.Fatal("claiming again for the same id gave another slice")
	}
	if err := b.Release("sb0a"); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.Lookup("sb0a"); !ok {
		t.Fatal("another owner's release took a's claim")
	}
	reopened, err := OpenClaims(dir, rng, "/data/a")
	if err != nil {
		t.Fatal(err)
	}
	if len(reopened.mine) != 8 {
		t.Fatalf("reopened claims know %d of a's 8 slices", len(reopened.mine))
	}
	if err := reopened.Sweep(func(id string) bool { return id == "sb1a" }); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 9 {
		t.Fatalf("after a's sweep %d claims are left, want b's 8 and a's live one", len(entries))
	}
	if _, err := reopened.Claim("new"); err != nil {
		t.Fatalf("a released slice was not given again: %v", err)
	}
}

func mustLookup(t *testing.T, c *Claims, id string) Slice {
	t.Helper()
	s, ok := c.Lookup(id)
	if !ok {
		t.Fatalf("no slice for %s", id)
	}
	return s
}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("needs root (CI is set, so this is a failure)")
		}
		t.Skip("needs root: namespaces and mounts")
	}
}

// nsGetOwnerUID is NS_GET_OWNER_UID (linux/nsfs.h): the owner of a user
// namespace, as a uid of the caller's namespace.
const nsGetOwnerUID = 0xb704

// TestCreateOwnedBySlice: the user namespace Create makes is owned by the
// slice's first id (not root, which would put every sandbox in root's
// per-user counts), maps as asked, and its network namespace belongs to
// it; RemoveFile takes both away.
func TestCreateOwnedBySlice(t *testing.T) {
	needRoot(t)
	if err := CheckTools(); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s := Slice{First: 1<<30 + 5*SliceSize}
	user, netns := filepath.Join(dir, "user"), filepath.Join(dir, "net")
	if err := Create(context.Background(), NamespaceOptions{Owner: s, Map: Mapping{HostID: s.First, Size: SliceSize},
		UserPath: user, NetPath: netns}); err != nil {
		t.Fatal(err)
	}
	defer RemoveFile(user)
	defer RemoveFile(netns)
	f, err := os.Open(user)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var owner uint32
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), nsGetOwnerUID, uintptr(unsafe.Pointer(&owner))); e != 0 {
		t.Fatal(e)
	}
	if owner != s.First {
		t.Fatalf("the namespace's owner is uid %d, want %d", owner, s.First)
	}
	nf, err := os.Open(netns)
	if err != nil {
		t.Fatal(err)
	}
	defer nf.Close()
	parent, err := unix.IoctlRetInt(int(nf.Fd()), unix.NS_GET_USERNS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(parent)
	var a, b unix.Stat_t
	if err := unix.Fstat(parent, &a); err != nil {
		t.Fatal(err)
	}
	if err := unix.Fstat(int(f.Fd()), &b); err != nil {
		t.Fatal(err)
	}
	if a.Ino != b.Ino {
		t.Fatal("the network namespace is not owned by the sandbox's user namespace")
	}
	for _, p := range []string{user, netns} {
		if err := RemoveFile(p); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s is still there", p)
		}
	}
}

// TestMapMount: files owned on disk by the storage ids look owned by the
// slice through the id-mapped mount, and files made through it by the
// slice's ids are stored with the storage ids; ids outside the map cannot
// create files.
func TestMapMount(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	if err := unix.Mount("tmpfs", base, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(base, unix.MNT_DETACH)
	src, dst := filepath.Join(base, "src"), filepath.Join(base, "dst")
	for _, d := range []string{src, dst} {
		if err := os.Mkdir(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	const from, to = 100000, 1<<30 + 7*SliceSize
	if err := os.WriteFile(filepath.Join(src, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(filepath.Join(src, "f"), from+1000, from+1000); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(src, from, from); err != nil {
		t.Fatal(err)
	}
	if err := MapMount(src, dst, from, to, SliceSize); err != nil {
		t.Fatal(err)
	}
	defer Unmount(dst)
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(dst, "f"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != to+1000 || st.Gid != to+1000 {
		t.Fatalf("through the mount f is %d:%d, want %d", st.Uid, st.Gid, to+1000)
	}
	if err := os.WriteFile(filepath.Join(dst, "root-made"), nil, 0o644); err == nil {
		t.Error("host root (outside the map) created a file through the mount")
	}
	if err := os.Chown(filepath.Join(dst, "f"), to+5, to+5); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat(filepath.Join(src, "f"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != from+5 {
		t.Fatalf("a chown to slice id %d through the mount is stored as %d, want %d", to+5, st.Uid, from+5)
	}
	if err := Unmount(dst); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), dst+" ") {
		t.Fatal("still mounted")
	}
}
