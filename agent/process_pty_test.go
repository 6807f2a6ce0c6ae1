package agent

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/internal/envdpb/processpb"
)

// ptyRequest returns a StartRequest running script in a cols x rows PTY.
func ptyRequest(script string, cols, rows uint32) *processpb.StartRequest {
	req := shell(script)
	req.Pty = &processpb.PTY{Size: &processpb.PTY_Size{Cols: cols, Rows: rows}}
	return req
}

// TestPTY proves a PTY process sees the requested size, Update resizes it,
// SendInput pty bytes reach it, output arrives as pty data only, and the
// stdin-pipe-only calls fail with failed_precondition.
func TestPTY(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	ctx := guardCtx(t)
	ev, pid := mustStart(t, ctx, c, ptyRequest(`stty size; read line; stty size; echo "got $line"; tty`, 80, 24))
	o := &outcome{pid: pid}
	readUntil(t, ev, o, "24 80")

	if _, err := c.Update(ctx, connect.NewRequest(&processpb.UpdateRequest{
		Process: pidSel(pid), Pty: &processpb.PTY{Size: &processpb.PTY_Size{Cols: 100, Rows: 30}},
	})); err != nil {
		t.Fatal(err)
	}
	_, err := c.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: pidSel(pid)}))
	wantCode(t, err, connect.CodeFailedPrecondition)
	_, err = c.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{
		Process: pidSel(pid), Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte("x")}},
	}))
	wantCode(t, err, connect.CodeFailedPrecondition)
	if _, err := c.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{
		Process: pidSel(pid), Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Pty{Pty: []byte("hello\n")}},
	})); err != nil {
		t.Fatal(err)
	}
	if err := collectRest(ev, o); err != nil {
		t.Fatal(err)
	}
	out := o.pty.String()
	for _, want := range []string{"24 80", "30 100", "got hello", "/dev/pts/"} {
		if !strings.Contains(out, want) {
			t.Errorf("pty output %q lacks %q", out, want)
		}
	}
	if o.stdout.Len() != 0 || o.stderr.Len() != 0 {
		t.Errorf("a PTY process sent stdout/stderr events: %q %q", o.stdout.String(), o.stderr.String())
	}
	wantExit(t, o, 0)
}

// TestUpdateWithoutPTY proves resizing a pipe process is failed_precondition.
func TestUpdateWithoutPTY(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	s, err := c.Start(guardCtx(t), connect.NewRequest(command("sleep", "30")))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	pid, err := expectStart(startEvents(s))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Update(guardCtx(t), connect.NewRequest(&processpb.UpdateRequest{
		Process: pidSel(pid), Pty: &processpb.PTY{Size: &processpb.PTY_Size{Cols: 1, Rows: 1}},
	}))
	wantCode(t, err, connect.CodeFailedPrecondition)
}

// TestPTYBackgroundChildDoesNotHoldStream proves a PTY command ends when its
// main process exits even if a child in another session keeps the terminal
// open (the 10 s context is a hang guard against the 30 s sleep).
func TestPTYBackgroundChildDoesNotHoldStream(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	o, err := runProcess(ctx, c, ptyRequest(`setsid sleep 30 & echo "bg $!"`, 80, 24), "")
	if f := strings.Fields(o.ptyString()); len(f) >= 2 {
		if bg, err := strconv.Atoi(f[1]); err == nil {
			t.Cleanup(func() { _ = syscall.Kill(bg, syscall.SIGKILL) })
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(o.pty.String(), "bg ") {
		t.Errorf("pty output = %q", o.pty.String())
	}
	wantExit(t, o, 0)
}

// TestStreamInput proves a client stream (start naming the process, then
// data events) feeds stdin in order.
func TestStreamInput(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	ctx := guardCtx(t)
	ev, pid := mustStart(t, ctx, c, shell(`head -c 12`))
	in := c.StreamInput(ctx)
	msgs := []*processpb.StreamInputRequest{{Event: &processpb.StreamInputRequest_Start{
		Start: &processpb.StreamInputRequest_StartEvent{Process: pidSel(pid)}}}}
	for _, chunk := range []string{"abc", "def", "ghi", "jkl"} {
		msgs = append(msgs, &processpb.StreamInputRequest{Event: &processpb.StreamInputRequest_Data{
			Data: &processpb.StreamInputRequest_DataEvent{Input: &processpb.ProcessInput{
				Input: &processpb.ProcessInput_Stdin{Stdin: []byte(chunk)}}}}})
	}
	for _, m := range msgs {
		if err := in.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	o := &outcome{pid: pid}
	if err := collectRest(ev, o); err != nil {
		t.Fatal(err)
	}
	if o.stdout.String() != "abcdefghijkl" {
		t.Fatalf("stdout = %q", o.stdout.String())
	}
	wantExit(t, o, 0)
}

// TestNoZombies proves the reaper leaves no zombie children behind: after
// normal exits, signal deaths, a failed exec and killed groups, none of the
// test process's children is defunct.
func TestNoZombies(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	bad := filepath.Join(t.TempDir(), "not-a-binary")
	if err := os.WriteFile(bad, []byte("\x7fELF garbage"), 0o755); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		mustRun(t, c, command("true"), "")
		mustRun(t, c, command("false"), "")
		mustRun(t, c, shell(`kill -9 $$`), "")
		mustRun(t, c, shell(`(exit 1) & (exit 2) & wait`), "")
		wantCode(t, startErr(t, c, command(bad), ""), connect.CodeInternal)
	}
	eventually(t, "no defunct children", func() bool {
		for _, pid := range childrenOfSelf(t) {
			if procState(pid) == "Z" {
				return false
			}
		}
		return true
	})
}

func (o *outcome) ptyString() string {
	if o == nil {
		return ""
	}
	return o.pty.String()
}

// TestPTYDrainEndsWithoutHangup proves the drain after exit ends a PTY
// command whose main process left its terminal without a hangup (it gave
// up the terminal, and a child it left holds it open): only the read
// deadline ends the read then, which a PTY master in blocking mode would
// not honour.
func TestPTYDrainEndsWithoutHangup(t *testing.T) {
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("python3 missing (the install script installs it): %v", err)
		}
		t.Skipf("python3 missing (scripts/install-deps.sh installs it): %v", err)
	}
	_, c := newProcessAgent(t, wire.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	script := `import fcntl, os, signal, termios
signal.signal(signal.SIGHUP, signal.SIG_IGN)
fcntl.ioctl(0, termios.TIOCNOTTY)
print("child", os.fork() or os.execvp("sleep", ["sleep", "30"]), flush=True)`
	o, err := runProcess(ctx, c, ptyRequest(`exec /usr/bin/python3 -c '`+script+`'`, 80, 24), "")
	if f := strings.Fields(o.ptyString()); len(f) >= 2 {
		if pid, err := strconv.Atoi(f[1]); err == nil {
			t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	wantExit(t, o, 0)
}
