package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestCLIDiffMergeForkRun drives forkbox diff, merge (a conflict lists
// its path and exits non-zero; --on-conflict theirs resolves it) and fork
// --run --keep best through the binary.
func TestCLIDiffMergeForkRun(t *testing.T) {
	parent := newSession(t, client.CreateRequest{})
	sh(t, parent.ID, `mkdir -p /home/user/w && echo base > /home/user/w/a.txt`)
	snap, err := env.c.Snapshot(ctxFor(t, time.Minute), parent.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	kid := forkAll(t, snap.ID, 1)[0].ID
	sh(t, kid, `echo kid > /home/user/w/a.txt; echo new > /home/user/w/b.txt`)
	sh(t, parent.ID, `echo parent > /home/user/w/a.txt`)

	out, errOut, code := forkbox(t, "", "diff", kid, "--patch")
	if code != 0 || !strings.Contains(out, "M /home/user/w/a.txt") || !strings.Contains(out, "A /home/user/w/b.txt") ||
		!strings.Contains(out, "-base\n+kid\n") {
		t.Fatalf("forkbox diff: %d %q %q", code, out, errOut)
	}
	out, errOut, code = forkbox(t, "", "merge", parent.ID, "--from", kid)
	if code == 0 || !strings.Contains(errOut, "conflict: /home/user/w/a.txt") || !strings.Contains(errOut, "HTTP 409") {
		t.Fatalf("forkbox merge with a conflict: %d %q %q", code, out, errOut)
	}
	out, errOut, code = forkbox(t, "", "merge", parent.ID, "--from", kid, "--on-conflict", "theirs")
	if code != 0 || !strings.Contains(out, "/home/user/w/b.txt") || !strings.Contains(out, "conflict resolved (theirs): /home/user/w/a.txt") {
		t.Fatalf("forkbox merge --on-conflict theirs: %d %q %q", code, out, errOut)
	}
	if got := sh(t, parent.ID, "cat /home/user/w/a.txt /home/user/w/b.txt"); got != "kid\nnew\n" {
		t.Fatalf("parent after the CLI merge: %q", got)
	}

	out, errOut, code = forkbox(t, "", "fork", snap.ID, "-n", "3", "--run", `echo "n=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')"`,
		"--keep", "best", "--score-regex", `n=(\d+)`)
	if code != 0 || strings.Count(out, "child ") != 3 || strings.Count(out, "kept ") != 1 {
		t.Fatalf("forkbox fork --run: %d %q %q", code, out, errOut)
	}
	for _, l := range strings.Split(out, "\n") {
		if id, ok := strings.CutPrefix(l, "kept "); ok {
			t.Cleanup(func() { _ = env.c.DeleteSession(ctxFor(t, time.Minute), id) })
		}
	}
}
