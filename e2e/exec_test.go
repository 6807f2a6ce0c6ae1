package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// TestExecExitCodesAndSignals proves exit codes pass through, a signal
// death is 128+N with the signal, and an unknown command gives 127 with
// the shell's message (shell form) or a 400 naming argv (argv form).
func TestExecExitCodesAndSignals(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	res, out, errOut := run(t, s.ID, client.ExecRequest{Cmd: "echo out; echo err >&2; exit 3"})
	if res.ExitCode != 3 || out != "out\n" || errOut != "err\n" || res.Signal != 0 {
		t.Errorf("exit 3: %+v %q %q", res, out, errOut)
	}
	res, _, _ = run(t, s.ID, client.ExecRequest{Cmd: "kill -TERM $$"})
	if res.ExitCode != 143 || res.Signal != 15 {
		t.Errorf("SIGTERM death: %+v, want exit 143 signal 15", res)
	}
	res, _, errOut = run(t, s.ID, client.ExecRequest{Cmd: "no-such-command-xyz"})
	if res.ExitCode != 127 || !strings.Contains(errOut, "not found") {
		t.Errorf("unknown command in shell form: %+v %q", res, errOut)
	}
	_, err := env.c.Exec(ctxFor(t, time.Minute), s.ID, client.ExecRequest{Argv: []string{"no-such-command-xyz"}}, nil, nil)
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Status != 400 || apiErr.Field != "argv" {
		t.Errorf("unknown command in argv form: %v, want 400 naming argv", err)
	}
	// The JSON form returns the same result with the output inline.
	o, err := env.c.ExecCollect(ctxFor(t, time.Minute), s.ID, client.ExecRequest{Argv: []string{"sh", "-c", "printf abc; exit 5"}})
	if err != nil || o.ExitCode != 5 || string(o.Stdout) != "abc" {
		t.Errorf("ExecCollect: %+v %v", o, err)
	}
}

// TestExecOutputIsRawBytes proves stdout carries arbitrary bytes unchanged
// (invalid UTF-8, NUL, a multi-byte character split across writes).
func TestExecOutputIsRawBytes(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	_, out, _ := run(t, s.ID, client.ExecRequest{Cmd: `printf '\377\376\000abc\342'; sleep 0.1; printf '\202\254end'`})
	want := "\xff\xfe\x00abc\xe2\x82\xacend"
	if out != want {
		t.Fatalf("stdout = %q, want %q", out, want)
	}
}

// TestExecTimeoutKillsProcessGroup proves the exec timeout, enforced from
// the host, kills the command and every process in its group.
func TestExecTimeoutKillsProcessGroup(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	res, _, _ := run(t, s.ID, client.ExecRequest{Cmd: "sleep 300 & sleep 301 & wait", TimeoutS: 1})
	if !res.TimedOut || res.ExitCode != 137 {
		t.Fatalf("result %+v, want timed_out with exit 137", res)
	}
	if out := sh(t, s.ID, "ps -eo comm= | grep -c '^sleep' || true"); strings.TrimSpace(out) != "0" {
		t.Fatalf("%s sleep processes survived the timeout", strings.TrimSpace(out))
	}
}

// TestExecReturnsWhenMainProcessExits proves a command that leaves a
// background child holding its output returns when its main process exits.
func TestExecReturnsWhenMainProcessExits(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	res, out, _ := run(t, s.ID, client.ExecRequest{Cmd: "sleep 120 & echo started", TimeoutS: 60})
	if res.ExitCode != 0 || out != "started\n" || res.TimedOut {
		t.Fatalf("result %+v %q", res, out)
	}
	if res.DurationMS > 30_000 {
		t.Fatalf("exec waited for the background child (%d ms)", res.DurationMS)
	}
}

// TestBackgroundProcesses proves background commands can be listed,
// re-attached (seeing later output and the exit), and killed.
func TestBackgroundProcesses(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	ctx := ctxFor(t, 2*time.Minute)
	pid, err := env.c.ExecBackground(ctx, s.ID, client.ExecRequest{
		Cmd: "i=0; while [ $i -lt 600 ]; do echo tick $i; i=$((i+1)); sleep 0.05; done", Tag: "ticker"})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := env.c.Processes(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !hasProcess(ps, pid, "ticker") {
		t.Fatalf("background pid %d not listed: %+v", pid, ps)
	}
	// Re-attach: the output continues; kill it from another goroutine.
	var out bytes.Buffer
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = env.c.Kill(ctx, s.ID, pid)
	}()
	res, err := env.c.Attach(ctx, s.ID, pid, &out, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "tick ") {
		t.Errorf("re-attached stream had no output: %q", out.String())
	}
	if res.Signal != 9 {
		t.Errorf("killed background command ended with %+v, want signal 9", res)
	}
	ps, _ = env.c.Processes(ctx, s.ID)
	if hasProcess(ps, pid, "") {
		t.Errorf("killed process still listed")
	}
	if err := env.c.Kill(ctx, s.ID, 99999); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("kill of an unknown pid: %v, want not found", err)
	}
	// Stdin kept open for a background command.
	pid, err = env.c.ExecBackground(ctx, s.ID, client.ExecRequest{Argv: []string{"sh", "-c", "read line; echo got:$line > /tmp/stdin.txt"}, KeepStdin: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := env.c.SendStdin(ctx, s.ID, pid, []byte("hello\n"), true); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		res, out, _ := run(t, s.ID, client.ExecRequest{Cmd: "cat /tmp/stdin.txt 2>/dev/null"})
		return res.ExitCode == 0 && out == "got:hello\n"
	})
}

func hasProcess(ps []client.Process, pid int, tag string) bool {
	for _, p := range ps {
		if p.Pid == pid && (tag == "" || p.Tag == tag) {
			return true
		}
	}
	return false
}

// waitFor polls cond until it holds (hang guard 30 s).
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestExecLongCommandText proves a 300 KiB shell command works (it is
// never passed as a single argv string, which the kernel caps at 128 KiB).
func TestExecLongCommandText(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	var b strings.Builder
	b.WriteString("echo start\n")
	for b.Len() < 300<<10 {
		b.WriteString("x=1 # padding padding padding padding padding padding padding padding\n")
	}
	b.WriteString("echo end; exit 7\n")
	res, out, errOut := run(t, s.ID, client.ExecRequest{Cmd: b.String()})
	if res.ExitCode != 7 || out != "start\nend\n" {
		t.Fatalf("long command: %+v stdout %q stderr %q", res, out, truncate(errOut, 200))
	}
}

// TestExecEnvIsByteExact proves env values with spaces, '=', newlines and
// quotes arrive byte for byte, and session env is applied under exec env.
func TestExecEnvIsByteExact(t *testing.T) {
	s := newSession(t, client.CreateRequest{Env: map[string]string{"SESSION_VAR": "from session", "OVERRIDE": "session"}})
	want := map[string]string{
		"SPACES": "a b  c ", "EQUALS": "k=v=w", "NEWLINES": "line1\nline2\n", "QUOTES": `"double" 'single' ` + "`back`" + ` $HOME \n`,
		"UNICODE": "héllo ✓", "OVERRIDE": "exec",
	}
	_, out, _ := run(t, s.ID, client.ExecRequest{Env: want, Argv: []string{"python3", "-c",
		"import os, json; print(json.dumps(dict(os.environ)))"}})
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("env dump: %v: %q", err, out)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("env %s = %q, want %q", k, got[k], v)
		}
	}
	if got["SESSION_VAR"] != "from session" || got["HOME"] != "/home/user" || got["USER"] != "user" {
		t.Errorf("session/default env wrong: SESSION_VAR=%q HOME=%q USER=%q", got["SESSION_VAR"], got["HOME"], got["USER"])
	}
}

// TestConcurrentExecsDoNotMix proves concurrent execs in one sandbox each
// get exactly their own output.
func TestConcurrentExecsDoNotMix(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	const n, lines = 6, 2000
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			marker := fmt.Sprintf("marker-%d", i)
			var out, errOut bytes.Buffer
			res, err := env.c.Exec(ctxFor(t, 2*time.Minute), s.ID, client.ExecRequest{
				Cmd: fmt.Sprintf("for i in $(seq %d); do echo %s; echo %s-err >&2; done", lines, marker, marker)}, &out, &errOut)
			if err != nil || res.ExitCode != 0 {
				errs <- fmt.Errorf("exec %d: %v %+v", i, err, res)
				return
			}
			if want := strings.Repeat(marker+"\n", lines); out.String() != want {
				errs <- fmt.Errorf("exec %d: stdout has foreign or missing lines (%d bytes, want %d)", i, out.Len(), len(want))
			}
			if want := strings.Repeat(marker+"-err\n", lines); errOut.String() != want {
				errs <- fmt.Errorf("exec %d: stderr has foreign or missing lines", i)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestExecStdinCwdUser proves stdin is /dev/null unless given, stdin data
// reaches the command, and cwd and user are honoured.
func TestExecStdinCwdUser(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	if _, out, _ := run(t, s.ID, client.ExecRequest{Argv: []string{"cat"}}); out != "" {
		t.Errorf("cat without stdin printed %q", out)
	}
	if _, out, _ := run(t, s.ID, client.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("hello\x00\xff")}); out != "hello\x00\xff" {
		t.Errorf("cat with stdin printed %q", out)
	}
	if out := strings.TrimSpace(sh(t, s.ID, "pwd")); out != "/home/user" {
		t.Errorf("default cwd %q", out)
	}
	if _, out, _ := run(t, s.ID, client.ExecRequest{Argv: []string{"pwd"}, Cwd: "/tmp"}); strings.TrimSpace(out) != "/tmp" {
		t.Errorf("cwd /tmp gave %q", out)
	}
	if _, out, _ := run(t, s.ID, client.ExecRequest{Argv: []string{"id", "-u"}, User: "root"}); strings.TrimSpace(out) != "0" {
		t.Errorf("root exec runs as %q", out)
	}
	if out := strings.TrimSpace(sh(t, s.ID, "id -u")); out != "1000" {
		t.Errorf("default exec runs as %q", out)
	}
	_, err := env.c.Exec(ctxFor(t, time.Minute), s.ID, client.ExecRequest{Argv: []string{"id"}, User: "nosuchuser"}, nil, nil)
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.Field != "user" {
		t.Errorf("unknown user: %v, want 400 naming user", err)
	}
	_, err = env.c.Exec(ctxFor(t, time.Minute), s.ID, client.ExecRequest{Argv: []string{"pwd"}, Cwd: "/no/such/dir"}, nil, nil)
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("missing cwd: %v, want invalid argument", err)
	}
}
