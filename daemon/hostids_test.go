package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/storage"
)

// TestCheckIDRanges: a host account that owns ids sandboxes run as or
// own files as (a subordinate range as useradd allocates for rootless
// containers, or a plain uid or gid), in the storage ids or in the
// sandboxes' id slices, stops the daemon; ranges beside them do not.
func TestCheckIDRanges(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	spans := sandboxIDSpans() // 100000..165535 and 2^30..
	if spans[0].first != uint64(storage.DefaultIDShift.UIDBase) || spans[1].first != 1<<30 {
		t.Fatalf("spans %+v", spans)
	}
	okSub := write("subuid-ok", "# comment\nalice:165536:65536\nbob:34464:65536\ncarol:600000000:65536\n")
	okPasswd := write("passwd-ok", "root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\nbig:x:165536:165536::/:/bin/sh\n")
	if err := checkIDRanges(spans, okSub, okSub, okPasswd, filepath.Join(dir, "missing")); err != nil {
		t.Fatalf("ranges outside the sandbox ids were refused: %v", err)
	}
	for name, files := range map[string][4]string{
		"useradd default subuid": {write("subuid-bad", "alice:100000:65536\n"), "", "", ""},
		"overlapping subgid end": {"", write("subgid-bad", "bob:40000:60001\n"), "", ""},
		"host uid in range":      {"", "", write("passwd-bad", "svc:x:123456:1000::/:/bin/sh\n"), ""},
		"host gid in range":      {"", "", "", write("group-bad", "sandboxes:x:100000:\n")},
		"subuid in the slices":   {write("subuid-slices", "dave:1073800000:65536\n"), "", "", ""},
		"host uid in the slices": {"", "", write("passwd-slices", "svc:x:1610612735:1000::/:/bin/sh\n"), ""},
	} {
		err := checkIDRanges(spans, files[0], files[1], files[2], files[3])
		if err == nil || !strings.Contains(err.Error(), "overlap") {
			t.Errorf("%s: err = %v, want an overlap error", name, err)
		}
	}
}

// TestCheckTraversable: a data directory under a directory that others
// cannot pass (as under /root, 0700) is refused with a message naming it;
// one under world-traversable directories is fine.
func TestCheckTraversable(t *testing.T) {
	base := t.TempDir()
	if err := os.Chmod(base, 0o711); err != nil {
		t.Fatal(err)
	}
	ok := filepath.Join(base, "open", "data")
	closed := filepath.Join(base, "closed", "data")
	for _, d := range []string{ok, closed} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Dir(closed), 0o700); err != nil {
		t.Fatal(err)
	}
	for p := filepath.Dir(base); p != "/"; p = filepath.Dir(p) {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm()&1 == 0 {
			t.Skipf("the test's temporary directory is under %s, which others cannot pass", p)
		}
	}
	if err := checkTraversable(ok); err != nil {
		t.Errorf("a data directory under traversable directories was refused: %v", err)
	}
	err := checkTraversable(closed)
	if err == nil || !strings.Contains(err.Error(), filepath.Dir(closed)) || !strings.Contains(err.Error(), "0700") {
		t.Errorf("a data directory under a 0700 directory: err = %v, want one naming the directory and its mode", err)
	}
}
