package agent

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// scrubChildEnv makes the test binary, run again as a child, scrub its
// start-up environment and print its /proc/self/environ.
const scrubChildEnv = "FORKBOX_TEST_SCRUB_CHILD"

// TestScrubEnviron proves scrubEnviron clears what /proc/self/environ
// shows of the strings it is given, in a fresh process (the kernel's
// block), and leaves the Go environment alone.
func TestScrubEnviron(t *testing.T) {
	if os.Getenv(scrubChildEnv) != "" {
		env := os.Environ()
		if err := scrubEnviron(env); err != nil {
			os.Stderr.WriteString(err.Error())
			os.Exit(2)
		}
		b, _ := os.ReadFile("/proc/self/environ")
		os.Stdout.Write(b)
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestScrubEnviron$")
	cmd.Env = []string{scrubChildEnv + "=1", "SECRET_FOR_TEST=do-not-show-me", "PATH=/usr/bin:/bin"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v: %s", err, stderr.String())
	}
	if len(out) == 0 {
		t.Fatal("child printed no environ")
	}
	for _, s := range []string{"do-not-show-me", "SECRET_FOR_TEST", "PATH=", scrubChildEnv} {
		if bytes.Contains(out, []byte(s)) {
			t.Fatalf("environ after the scrub still holds %q: %q", s, out)
		}
	}
	if err := scrubEnviron(nil); err != nil {
		t.Fatalf("empty environment: %v", err)
	}
}
