package e2e

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFleetE2BSDK runs part of the unmodified e2b JS SDK suite
// (compat/e2b: sandboxes, commands, files) against host a of a
// three-host fleet: its creates are placed over a, b and c, and every
// call for a sandbox on b or c, envd's Connect streams included, goes
// through a. The suite's egress, ports, template and CLI files need the
// single test daemon's settings (its resolver, domain, tenants) and stay
// in TestE2BSDK.
func TestFleetE2BSDK(t *testing.T) {
	need(t)
	dir, _ := npmSuite(t, "e2b", "e2b")
	node, err := exec.LookPath("node")
	if err != nil {
		skipOrFail(t, "needs Node.js: %v", err)
	}
	procs := startFleet(t, []string{"a", "b", "c"})
	a := procs[0]
	key, err := os.ReadFile(filepath.Join(a.dataDir, "api-key"))
	if err != nil {
		t.Fatal(err)
	}
	started := func() []int {
		var n []int
		for _, p := range procs {
			n = append(n, strings.Count(p.log.String(), `msg="session started"`))
		}
		return n
	}
	before := started()
	environ := []string{"E2B_API_URL=" + a.c.BaseURL(), "E2B_SANDBOX_URL=" + a.c.BaseURL(), "E2B_API_KEY=" + strings.TrimSpace(string(key))}
	var live io.Writer
	if testing.Verbose() {
		live = os.Stdout
	}
	out, err := runNPM(ctxFor(t, 5*time.Minute), dir, node, environ, live,
		"--test", "--test-reporter=spec", "--test-concurrency=3", "sandbox.test.mjs", "commands.test.mjs", "files.test.mjs")
	if err != nil {
		// The fleet's own warnings (heartbeats, lost hosts, forwarding)
		// of every host, which a log's tail may have lost.
		for i, p := range procs {
			var lines []string
			for _, l := range strings.Split(p.log.String(), "\n") {
				if strings.Contains(l, "level=WARN") && (strings.Contains(l, "fleet") || strings.Contains(l, "ReverseProxy")) {
					lines = append(lines, l)
				}
			}
			t.Logf("host %c's fleet warnings:\n%s", 'a'+i, strings.Join(lines, "\n"))
		}
		t.Fatalf("e2b SDK through a: %v\n%s", err, out)
	}
	if !testing.Verbose() {
		t.Logf("e2b SDK through a: %s", summary(out))
	}
	after := started()
	t.Logf("sessions started per host during the suite: a %d, b %d, c %d", after[0]-before[0], after[1]-before[1], after[2]-before[2])
	if after[2] == before[2] || after[1] == before[1] {
		t.Errorf("the suite's sandboxes were not placed on b and c: %v → %v", before, after)
	}
}
