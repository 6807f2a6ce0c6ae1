package daemon

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/storage"
)

// TestCheckIDRange: a host account that owns ids sandboxes run as (a
// subordinate range as useradd allocates for rootless containers, or a
// plain uid or gid) stops the daemon; ranges beside it do not.
func TestCheckIDRange(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	shift := storage.DefaultIDShift // 100000..165535
	okSub := write("subuid-ok", "# comment\nalice:165536:65536\nbob:34464:65536\n")
	okPasswd := write("passwd-ok", "root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\nbig:x:165536:165536::/:/bin/sh\n")
	if err := checkIDRange(shift, okSub, okSub, okPasswd, filepath.Join(dir, "missing")); err != nil {
		t.Fatalf("ranges outside the sandbox ids were refused: %v", err)
	}
	for name, files := range map[string][4]string{
		"useradd default subuid": {write("subuid-bad", "alice:100000:65536\n"), "", "", ""},
		"overlapping subgid end": {"", write("subgid-bad", "bob:40000:60001\n"), "", ""},
		"host uid in range":      {"", "", write("passwd-bad", "svc:x:123456:1000::/:/bin/sh\n"), ""},
		"host gid in range":      {"", "", "", write("group-bad", "sandboxes:x:100000:\n")},
	} {
		err := checkIDRange(shift, files[0], files[1], files[2], files[3])
		if err == nil || !strings.Contains(err.Error(), "overlap") {
			t.Errorf("%s: err = %v, want an overlap error", name, err)
		}
	}
}
