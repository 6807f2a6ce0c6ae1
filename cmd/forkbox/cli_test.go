package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/daemon/daemontest"
)

// cli runs the forkbox command line in-process (the same execute main
// calls) with args and stdin, against the daemon FORKBOX_URL names, and
// returns its stdout, stderr and exit code.
func cli(t *testing.T, stdin string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a hang guard
	defer cancel()
	var out, errOut bytes.Buffer
	code := execute(ctx, args, strings.NewReader(stdin), &out, &errOut)
	return out.String(), errOut.String(), code
}

// mustCLI is cli that fails t unless the command exits 0; it returns stdout.
func mustCLI(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	out, errOut, code := cli(t, stdin, args...)
	if code != 0 {
		t.Fatalf("forkbox %s: exit %d, stderr %q", strings.Join(args, " "), code, errOut)
	}
	return out
}

// TestCommands runs the CLI's commands against one real daemon: each
// subtest is a group of commands, its sessions destroyed at its end.
func TestCommands(t *testing.T) {
	d := daemontest.Start(t)
	t.Setenv("FORKBOX_URL", d.URL)
	t.Setenv("FORKBOX_API_KEY", d.Key)
	t.Run("SessionLifecycle", testSessionLifecycle)
	t.Run("ExecAndCp", testExecAndCp)
	t.Run("SnapshotAndFork", testSnapshotAndFork)
	t.Run("BadInput", testBadInput)
	t.Run("HostDrain", testHostDrain)
}

// testHostDrain drains the daemon's own host (alone: "local") and makes
// it ready again: hosts shows it draining with its sessions left, and an
// unknown host is an error.
func testHostDrain(t *testing.T) {
	t.Cleanup(func() { cli(t, "", "host", "undrain", "local") })
	if out := mustCLI(t, "", "host", "drain", "local", "--wait", "30s"); !strings.Contains(out, "host local: draining, 0 sessions left") ||
		!strings.Contains(out, "host local: drained") {
		t.Fatalf("host drain printed %q", out)
	}
	if out := mustCLI(t, "", "hosts"); !strings.Contains(out, "draining (0 left)") || !strings.Contains(out, "POOLED") {
		t.Fatalf("hosts while draining:\n%s", out)
	}
	if _, errOut, code := cli(t, "", "host", "drain", "nope"); code == 0 || !strings.Contains(errOut, "nope") {
		t.Fatalf("drain of an unknown host: exit %d, stderr %q", code, errOut)
	}
	if out := mustCLI(t, "", "host", "undrain", "local"); out != "host local: ready\n" {
		t.Fatalf("host undrain printed %q", out)
	}
	if out := mustCLI(t, "", "hosts"); !strings.Contains(out, "local *  ready") {
		t.Fatalf("hosts after undrain:\n%s", out)
	}
}

// create makes a session through the CLI and destroys it when t ends.
func create(t *testing.T, args ...string) string {
	t.Helper()
	id := strings.TrimSpace(mustCLI(t, "", append([]string{"create", "--disk", "256"}, args...)...))
	if id == "" || strings.ContainsAny(id, " \n") {
		t.Fatalf("create printed %q, want one id", id)
	}
	t.Cleanup(func() { cli(t, "", "rm", id) })
	return id
}

func testSessionLifecycle(t *testing.T) {
	if out := mustCLI(t, "", "version"); !strings.Contains(out, "daemon ") {
		t.Errorf("version does not show the daemon's:\n%s", out)
	}
	id := create(t, "--label", "cli=lifecycle", "--memory", "256")
	out := mustCLI(t, "", "ls")
	if !strings.Contains(out, id) || !strings.Contains(out, "cli=lifecycle") || !strings.Contains(out, "256MiB") {
		t.Fatalf("ls does not show %s with its label and memory:\n%s", id, out)
	}
	if out := mustCLI(t, "", "pause", id); out != id+" paused\n" {
		t.Fatalf("pause printed %q", out)
	}
	if out := mustCLI(t, "", "resume", id); out != id+" running\n" {
		t.Fatalf("resume printed %q", out)
	}
	if out := mustCLI(t, "", "rm", id); out != id+"\n" {
		t.Fatalf("rm printed %q", out)
	}
	if out := mustCLI(t, "", "ls"); strings.Contains(out, id) {
		t.Fatalf("ls still lists %s after rm:\n%s", id, out)
	}
	if out := mustCLI(t, "", "ls", "--all", "--json"); !strings.Contains(out, `"id": "`+id+`"`) || !strings.Contains(out, `"reason": "deleted"`) {
		t.Fatalf("ls --all --json does not show %s deleted:\n%s", id, out)
	}
	// rm of an unknown id says so and exits 125 (a forkbox failure),
	// after removing the others.
	other := create(t)
	out, errOut, code := cli(t, "", "rm", "nosuchsession", other)
	if code != 125 || out != other+"\n" || !strings.Contains(errOut, `session "nosuchsession" not found`) {
		t.Fatalf("rm of an unknown and a known id: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

func testExecAndCp(t *testing.T) {
	id := create(t)
	// Output is streamed to the command's stdout and stderr; its exit
	// code is the CLI's.
	out, errOut, code := cli(t, "", "exec", "-e", "X=1", id, "--", "sh", "-c", "echo out $X; echo err >&2; exit 4")
	if code != 4 || out != "out 1\n" || errOut != "err\n" {
		t.Fatalf("exec: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if out := mustCLI(t, "piped\n", "exec", "-i", "-u", "root", id, "--", "sh", "-c", "id -un; cat"); out != "root\npiped\n" {
		t.Fatalf("exec -i -u root printed %q", out)
	}
	if _, errOut, code := cli(t, "", "exec", "--timeout", "1", id, "--", "sleep", "30"); code == 0 || !strings.Contains(errOut, "timed out") {
		t.Fatalf("exec past --timeout: exit %d, stderr %q", code, errOut)
	}
	if _, _, code := cli(t, "", "exec", id, "--", "no-such-binary"); code != exitNotFound {
		t.Fatalf("exec of a missing command exited %d, want %d", code, exitNotFound)
	}

	// cp in (into a directory keeps the name), out to a file, a
	// directory and stdout, and in from stdin.
	dir := t.TempDir()
	local := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(local, []byte("file content\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	mustCLI(t, "", "cp", local, id+":/home/user/")
	mustCLI(t, "from stdin", "cp", "-", id+":/tmp/stdin.txt")
	if out := mustCLI(t, "", "exec", id, "--", "cat", "/home/user/in.txt", "/tmp/stdin.txt"); out != "file content\nfrom stdin" {
		t.Fatalf("the sandbox reads %q", out)
	}
	back := filepath.Join(dir, "back.txt")
	mustCLI(t, "", "cp", id+":/home/user/in.txt", back)
	if b, err := os.ReadFile(back); err != nil || string(b) != "file content\n" {
		t.Fatalf("cp out wrote %q (%v)", b, err)
	}
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	mustCLI(t, "", "cp", id+":/tmp/stdin.txt", sub)
	if b, err := os.ReadFile(filepath.Join(sub, "stdin.txt")); err != nil || string(b) != "from stdin" {
		t.Fatalf("cp out into a directory wrote %q (%v)", b, err)
	}
	if out := mustCLI(t, "", "cp", id+":/home/user/in.txt", "-"); out != "file content\n" {
		t.Fatalf("cp out to stdout printed %q", out)
	}
	// A failed download leaves no file behind.
	if _, errOut, code := cli(t, "", "cp", id+":/home/user/missing", filepath.Join(dir, "missing")); code == 0 || errOut == "" {
		t.Fatalf("cp of a missing file: exit %d, stderr %q", code, errOut)
	}
	if names, _ := os.ReadDir(dir); len(names) != 3 {
		t.Fatalf("the local directory holds %v, want in.txt, back.txt and sub", names)
	}

	// run: a session of its own, the command's exit code, destroyed after.
	out, errOut, code = cli(t, "", "run", "--disk", "256", "--label", "cli=run", "--", "sh", "-c", "echo ran; exit 3")
	if code != 3 || out != "ran\n" {
		t.Fatalf("run: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if out := mustCLI(t, "", "ls"); strings.Contains(out, "cli=run") {
		t.Fatalf("run left its session running:\n%s", out)
	}
}

func testSnapshotAndFork(t *testing.T) {
	id := create(t)
	mustCLI(t, "", "exec", id, "--", "sh", "-c", "echo v1 > /home/user/mark")
	snap := strings.TrimSpace(mustCLI(t, "", "snapshot", id))
	if out := mustCLI(t, "", "snapshot", "ls"); !strings.Contains(out, snap) || !strings.Contains(out, id) {
		t.Fatalf("snapshot ls does not show %s of %s:\n%s", snap, id, out)
	}
	mustCLI(t, "", "exec", id, "--", "sh", "-c", "echo v2 > /home/user/mark")
	forks := strings.Fields(mustCLI(t, "", "fork", "--from-snapshot", "--disk", "256", "-n", "2", snap))
	fromSession := strings.Fields(mustCLI(t, "", "fork", "--disk", "256", id))
	if len(forks) != 2 || len(fromSession) != 1 {
		t.Fatalf("fork printed %v and %v, want 2 and 1 ids", forks, fromSession)
	}
	for want, ids := range map[string][]string{"v1\n": forks, "v2\n": fromSession} {
		for _, f := range ids {
			t.Cleanup(func() { cli(t, "", "rm", f) })
			if out := mustCLI(t, "", "exec", f, "--", "cat", "/home/user/mark"); out != want {
				t.Errorf("fork %s reads %q, want %q", f, out, want)
			}
		}
	}
	// Sessions are built on the snapshot: rm refuses it without --force.
	if _, errOut, code := cli(t, "", "snapshot", "rm", snap); code == 0 || !strings.Contains(errOut, snap+": ") {
		t.Fatalf("snapshot rm of a snapshot in use: exit %d, stderr %q", code, errOut)
	}
	if out := mustCLI(t, "", "snapshot", "rm", "--force", snap); out != snap+"\n" {
		t.Fatalf("snapshot rm --force printed %q", out)
	}
	if out := mustCLI(t, "", "snapshot", "ls"); strings.Contains(out, snap) {
		t.Fatalf("snapshot ls still shows %s:\n%s", snap, out)
	}
}
