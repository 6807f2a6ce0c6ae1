package agent

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/internal/envdpb/processpb"
	"github.com/forkbox/forkbox/internal/envdpb/processpb/processpbconnect"
)

// killLater kills pid's process group when t ends (background children a
// test leaves behind).
func killLater(t *testing.T, pgid int) {
	t.Cleanup(func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
}

// TestBackgroundChildDoesNotHoldStream proves a command whose background
// child keeps stdout open ends when its main process exits, with exit 0
// and its output (the 10 s context is a hang guard against the 30 s sleep).
func TestBackgroundChildDoesNotHoldStream(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	o, err := runProcess(ctx, c, shell(`sleep 30 & echo done`), "")
	if err != nil {
		t.Fatal(err)
	}
	killLater(t, int(o.pid))
	if o.stdout.String() != "done\n" {
		t.Errorf("stdout = %q", o.stdout.String())
	}
	wantExit(t, o, 0)
}

// TestDeadlineKillsProcess proves a Connect deadline (Connect-Timeout-Ms)
// kills the process: the stream fails and List no longer shows it.
func TestDeadlineKillsProcess(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ev, pid := mustStart(t, ctx, c, command("sleep", "30"))
	o := &outcome{pid: pid}
	if err := collectRest(ev, o); err == nil && o.end.GetStatus() != "signal: killed" {
		t.Fatalf("stream ended with %v", o.end)
	}
	eventually(t, "the timed-out process leaves List", func() bool { return listed(t, c, pid) == nil })
}

// TestDisconnectLeavesProcessRunning proves a client that goes away
// without a deadline leaves its process running: it stays in List, a later
// Connect follows it, and SendSignal SIGKILL ends it.
func TestDisconnectLeavesProcessRunning(t *testing.T) {
	a, c := newProcessAgent(t, wire.Config{})
	ctx, cancel := context.WithCancel(context.Background())
	s, err := c.Start(ctx, connect.NewRequest(command("sleep", "30")))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := expectStart(startEvents(s))
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	s.Close()
	p := a.procs.find(int(pid), "")
	eventually(t, "the server notices the disconnect", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.subs) == 0
	})
	if p.ended() || listed(t, c, pid) == nil || dead(int(pid)) {
		t.Fatal("the process did not survive its client's disconnect")
	}

	cs, err := c.Connect(guardCtx(t), connect.NewRequest(&processpb.ConnectRequest{Process: pidSel(pid)}))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	ev := connectEvents(cs)
	if got, err := expectStart(ev); err != nil || got != pid {
		t.Fatalf("Connect start = %d, %v; want pid %d", got, err, pid)
	}
	if _, err := c.SendSignal(guardCtx(t), connect.NewRequest(&processpb.SendSignalRequest{
		Process: pidSel(pid), Signal: processpb.Signal_SIGNAL_SIGKILL,
	})); err != nil {
		t.Fatal(err)
	}
	o := &outcome{pid: pid}
	if err := collectRest(ev, o); err != nil {
		t.Fatal(err)
	}
	if o.end.GetStatus() != "signal: killed" {
		t.Fatalf("end = %v, want signal: killed", o.end)
	}
	if listed(t, c, pid) != nil {
		t.Fatal("an ended process is still listed")
	}
	_, err = c.SendSignal(guardCtx(t), connect.NewRequest(&processpb.SendSignalRequest{
		Process: pidSel(pid), Signal: processpb.Signal_SIGNAL_SIGKILL,
	}))
	wantCode(t, err, connect.CodeNotFound)
}

// sendLine writes line to pid's stdin.
func sendLine(t *testing.T, c processpbconnect.ProcessClient, sel *processpb.ProcessSelector, line string) {
	t.Helper()
	_, err := c.SendInput(guardCtx(t), connect.NewRequest(&processpb.SendInputRequest{
		Process: sel, Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte(line)}},
	}))
	if err != nil {
		t.Fatal(err)
	}
}

// readUntil reads events into o until its stdout contains want.
func readUntil(t *testing.T, ev next, o *outcome, want string) {
	t.Helper()
	for !strings.Contains(o.stdout.String()+o.pty.String(), want) {
		e, err := ev()
		if err != nil {
			t.Fatalf("stream ended before %q arrived (got %q %q): %v", want, o.stdout.String(), o.pty.String(), err)
		}
		if e.GetEnd() != nil {
			t.Fatalf("process ended before %q arrived (got %q %q)", want, o.stdout.String(), o.pty.String())
		}
		o.stdout.Write(e.GetData().GetStdout())
		o.pty.Write(e.GetData().GetPty())
	}
}

// TestListAndConnect proves List shows a running process with its config
// and tag, Connect by pid and by tag re-attaches and receives later output
// and the end event, an ended process still yields start and end, and an
// unknown pid or tag is not_found.
func TestListAndConnect(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	ctx := guardCtx(t)
	req := shell(`read a; echo "got $a"; read b; echo "got $b"; exit 4`)
	tag := "worker-1"
	req.Tag = &tag
	req.Process.Envs = map[string]string{"K": "v"}
	s, err := c.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	startEv := startEvents(s)
	pid, err := expectStart(startEv)
	if err != nil {
		t.Fatal(err)
	}

	info := listed(t, c, pid)
	if info == nil {
		t.Fatalf("pid %d not listed", pid)
	}
	cfg := info.GetConfig()
	if info.GetTag() != tag || cfg.GetCmd() != "/bin/sh" || len(cfg.GetArgs()) != 2 || cfg.GetArgs()[1] != req.Process.Args[1] || cfg.GetEnvs()["K"] != "v" {
		t.Fatalf("List entry = %v", info)
	}

	var streams []next
	for _, sel := range []*processpb.ProcessSelector{pidSel(pid), tagSel(tag)} {
		cs, err := c.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{Process: sel}))
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		ev := connectEvents(cs)
		if got, err := expectStart(ev); err != nil || got != pid {
			t.Fatalf("Connect(%v) start = %d, %v; want %d", sel, got, err, pid)
		}
		streams = append(streams, ev)
	}
	streams = append(streams, startEv)
	outs := make([]*outcome, len(streams))
	sendLine(t, c, tagSel(tag), "one\n")
	for i, ev := range streams {
		outs[i] = &outcome{pid: pid}
		readUntil(t, ev, outs[i], "got one\n")
	}
	sendLine(t, c, pidSel(pid), "two\n")
	for i, ev := range streams {
		if err := collectRest(ev, outs[i]); err != nil {
			t.Fatal(err)
		}
		if got := outs[i].stdout.String(); got != "got one\ngot two\n" {
			t.Errorf("stream %d stdout = %q", i, got)
		}
		wantExit(t, outs[i], 4)
	}

	// Just ended: Connect gives start and the end event.
	cs, err := c.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{Process: tagSel(tag)}))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	o, err := collect(connectEvents(cs))
	if err != nil {
		t.Fatal(err)
	}
	wantExit(t, o, 4)

	for _, sel := range []*processpb.ProcessSelector{pidSel(0x7ffffff0), tagSel("no-such-tag")} {
		cs, err := c.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{Process: sel}))
		if err == nil {
			_, err = collect(connectEvents(cs))
			cs.Close()
		}
		wantCode(t, err, connect.CodeNotFound)
	}
	_, err = c.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{
		Process: pidSel(pid), Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte("x")}},
	}))
	wantCode(t, err, connect.CodeNotFound)
}

// TestTagSelectsMostRecent proves a tag shared by several processes selects
// the most recently started one, among ended ones and among running ones.
func TestTagSelectsMostRecent(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	tag := "shared"
	var last uint32
	for i := 0; i < 6; i++ {
		req := command("true")
		req.Tag = &tag
		last = mustRun(t, c, req, "").pid
	}
	cs, err := c.Connect(guardCtx(t), connect.NewRequest(&processpb.ConnectRequest{Process: tagSel(tag)}))
	if err != nil {
		t.Fatal(err)
	}
	o, err := collect(connectEvents(cs))
	cs.Close()
	if err != nil {
		t.Fatal(err)
	}
	if o.pid != last {
		t.Fatalf("tag %q selected pid %d, want the latest %d", tag, o.pid, last)
	}

	var running []uint32
	for i := 0; i < 4; i++ {
		req := command("sleep", "30")
		req.Tag = &tag
		s, err := c.Start(guardCtx(t), connect.NewRequest(req))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		pid, err := expectStart(startEvents(s))
		if err != nil {
			t.Fatal(err)
		}
		running = append(running, pid)
	}
	cs, err = c.Connect(guardCtx(t), connect.NewRequest(&processpb.ConnectRequest{Process: tagSel(tag)}))
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if got, err := expectStart(connectEvents(cs)); err != nil || got != running[len(running)-1] {
		t.Fatalf("tag %q selected pid %d (%v), want the latest running %d", tag, got, err, running[len(running)-1])
	}
}

// TestSignalKillsProcessGroup proves SendSignal SIGTERM reaches the whole
// process group: the shell and its background children all die.
func TestSignalKillsProcessGroup(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	s, err := c.Start(guardCtx(t), connect.NewRequest(shell(`sleep 30 & echo $!; sleep 31 & echo $!; wait`)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ev := startEvents(s)
	pid, err := expectStart(ev)
	if err != nil {
		t.Fatal(err)
	}
	killLater(t, int(pid))
	o := &outcome{pid: pid}
	for strings.Count(o.stdout.String(), "\n") < 2 {
		e, err := ev()
		if err != nil || e.GetEnd() != nil {
			t.Fatalf("stream ended early: %v %v", e, err)
		}
		o.stdout.Write(e.GetData().GetStdout())
	}
	var children []int
	for _, f := range strings.Fields(o.stdout.String()) {
		n, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("child pid %q", f)
		}
		children = append(children, n)
	}
	if _, err := c.SendSignal(guardCtx(t), connect.NewRequest(&processpb.SendSignalRequest{
		Process: pidSel(pid), Signal: processpb.Signal_SIGNAL_SIGTERM,
	})); err != nil {
		t.Fatal(err)
	}
	if err := collectRest(ev, o); err != nil {
		t.Fatal(err)
	}
	if o.end.GetStatus() != "signal: terminated" || o.end.GetExited() {
		t.Fatalf("end = %v, want signal: terminated", o.end)
	}
	for _, child := range children {
		eventually(t, fmt.Sprintf("child %d dies", child), func() bool { return dead(child) })
	}

	_, err = c.SendSignal(guardCtx(t), connect.NewRequest(&processpb.SendSignalRequest{Process: pidSel(pid)}))
	wantCode(t, err, connect.CodeNotFound) // ended; an unspecified signal is checked after lookup
}

// TestUnsupportedSignal proves a signal other than SIGTERM/SIGKILL is invalid_argument.
func TestUnsupportedSignal(t *testing.T) {
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
	_, err = c.SendSignal(guardCtx(t), connect.NewRequest(&processpb.SendSignalRequest{Process: pidSel(pid)}))
	wantCode(t, err, connect.CodeInvalidArgument)
	if dead(int(pid)) {
		t.Fatal("an invalid signal request killed the process")
	}
}

// TestConcurrentStartsDoNotMix proves streams of processes started at the
// same time carry only their own output, complete and in order.
func TestConcurrentStartsDoNotMix(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	const n, lines = 8, 1000
	var wg sync.WaitGroup
	errs := make([]error, n)
	outs := make([]*outcome, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			script := fmt.Sprintf(`i=0; while [ $i -lt %d ]; do echo marker-%d-$i; echo err-%d >&2; i=$((i+1)); done`, lines, i, i)
			ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
			defer cancel()
			outs[i], errs[i] = runProcess(ctx, c, shell(script), "")
		}()
	}
	wg.Wait()
	for i := 0; i < n; i++ {
		if errs[i] != nil {
			t.Fatalf("process %d: %v", i, errs[i])
		}
		var want, wantErr strings.Builder
		for j := 0; j < lines; j++ {
			fmt.Fprintf(&want, "marker-%d-%d\n", i, j)
			fmt.Fprintf(&wantErr, "err-%d\n", i)
		}
		if outs[i].stdout.String() != want.String() || outs[i].stderr.String() != wantErr.String() {
			t.Errorf("process %d: stdout %d bytes, stderr %d bytes; want %d and %d exactly",
				i, outs[i].stdout.Len(), outs[i].stderr.Len(), want.Len(), wantErr.Len())
		}
		wantExit(t, outs[i], 0)
	}
}
