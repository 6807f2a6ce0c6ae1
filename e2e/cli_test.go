package e2e

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// forkbox runs the CLI binary against the test daemon.
func forkbox(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(env.cli, args...)
	cmd.Env = append(os.Environ(), "FORKBOX_URL="+env.d.URL, "FORKBOX_API_KEY="+env.key)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

// TestCLIRun proves `forkbox run` prints Python's output from a sandbox
// and exits with the command's status, destroying the sandbox.
func TestCLIRun(t *testing.T) {
	need(t)
	out, errOut, code := forkbox(t, "", "run", "--", "python3", "-c", "import sys; print(sys.version); sys.exit(3)")
	if code != 3 || !strings.HasPrefix(out, "3.") {
		t.Fatalf("forkbox run: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	_, _, code = forkbox(t, "", "run", "--", "no-such-binary")
	if code != 127 {
		t.Fatalf("forkbox run of a missing command exited %d, want 127", code)
	}
	_, _, code = forkbox(t, "", "run", "--memory", "-3", "--", "true")
	if code != 125 {
		t.Fatalf("forkbox run with a bad limit exited %d, want 125", code)
	}
	out, _, _ = forkbox(t, "", "ls", "--json", "--all")
	if !strings.Contains(out, `"reason": "deleted"`) {
		t.Fatalf("forkbox run did not destroy its session: %s", out)
	}
}

// TestCLISessionCommands proves create, exec (with -i stdin), cp in both
// directions and rm.
func TestCLISessionCommands(t *testing.T) {
	need(t)
	out, errOut, code := forkbox(t, "", "create", "--label", "cli=1")
	if code != 0 {
		t.Fatalf("create: %d %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	defer forkbox(t, "", "rm", id)
	local := filepath.Join(t.TempDir(), "in.txt")
	os.WriteFile(local, []byte("file content\n"), 0o644)
	if _, errOut, code := forkbox(t, "", "cp", local, id+":/home/user/"); code != 0 {
		t.Fatalf("cp in: %s", errOut)
	}
	out, _, code = forkbox(t, "piped\n", "exec", "-i", id, "--", "sh", "-c", "cat in.txt; cat; exit 4")
	if code != 4 || out != "file content\npiped\n" {
		t.Fatalf("exec: %d %q", code, out)
	}
	back := filepath.Join(t.TempDir(), "out.txt")
	if _, errOut, code := forkbox(t, "", "cp", id+":/home/user/in.txt", back); code != 0 {
		t.Fatalf("cp out: %s", errOut)
	}
	if b, _ := os.ReadFile(back); string(b) != "file content\n" {
		t.Fatalf("copied back %q", b)
	}
	if out, _, _ := forkbox(t, "", "ls"); !strings.Contains(out, id) || !strings.Contains(out, "cli=1") {
		t.Fatalf("ls does not show %s:\n%s", id, out)
	}
	if _, _, code := forkbox(t, "", "rm", id); code != 0 {
		t.Fatalf("rm failed")
	}
}
