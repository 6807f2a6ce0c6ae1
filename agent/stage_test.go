package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/internal/envdpb/processpb"
)

// stage posts data to the agent's /stage and returns the staged id.
func stage(t *testing.T, srv *httptest.Server, data []byte) string {
	t.Helper()
	resp, err := srv.Client().Post(srv.URL+"/stage", "application/octet-stream", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var r wire.StageReply
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&r) != nil || r.Size != int64(len(data)) {
		t.Fatalf("stage: HTTP %d, %+v", resp.StatusCode, r)
	}
	return r.ID
}

// TestStagedScriptAndStdin proves a staged script runs as the shell's
// script, staged stdin reaches the process before input sent after the
// start, keep-stdin leaves the pipe open for it, and a staged input is
// taken once.
func TestStagedScriptAndStdin(t *testing.T) {
	_, c, srv := newProcessAgentServer(t, wire.Config{})
	ctx := guardCtx(t)
	script := "read first; echo \"got $first\"; cat\n# " + strings.Repeat("p", 300<<10) + "\n"
	stdin := strings.Repeat("line one\n", 1) + strings.Repeat("z", 200<<10)
	scriptID, stdinID := stage(t, srv, []byte(script)), stage(t, srv, []byte(stdin))
	req := connect.NewRequest(command("/bin/sh"))
	req.Header().Set(wire.ScriptHeader, scriptID)
	req.Header().Set(wire.StdinHeader, stdinID)
	req.Header().Set(wire.KeepStdinHeader, "1")
	s, err := c.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ev := startEvents(s)
	pid, err := expectStart(ev)
	if err != nil {
		t.Fatal(err)
	}
	more := connect.NewRequest(&processpb.SendInputRequest{Process: pidSel(pid),
		Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: []byte("|after")}}})
	if _, err := c.SendInput(ctx, more); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: pidSel(pid)})); err != nil {
		t.Fatal(err)
	}
	o := &outcome{pid: pid}
	if err := collectRest(ev, o); err != nil {
		t.Fatal(err)
	}
	if want := "got line one\n" + strings.Repeat("z", 200<<10) + "|after"; o.stdout.String() != want {
		t.Fatalf("stdout %d bytes %.40q..., want %d bytes (stderr %q)", o.stdout.Len(), o.stdout.String(), len(want), o.stderr.String())
	}
	wantExit(t, o, 0)

	again := connect.NewRequest(command("/bin/sh"))
	again.Header().Set(wire.ScriptHeader, scriptID)
	wantCode(t, func() error { _, err := runStream(ctx, c, again); return err }(), connect.CodeFailedPrecondition)
}

// TestStagedStdinWithoutKeepIsClosed proves staged stdin without
// keep-stdin ends with EOF, and SendInput with a staged input appends it.
func TestStagedStdinWithoutKeepIsClosed(t *testing.T) {
	_, c, srv := newProcessAgentServer(t, wire.Config{})
	req := connect.NewRequest(command("wc", "-c"))
	req.Header().Set(wire.StdinHeader, stage(t, srv, bytes.Repeat([]byte{0, 0xff}, 3<<19)))
	o, err := runStream(guardCtx(t), c, req)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(o.stdout.String()); got != strconv.Itoa(3<<20) {
		t.Fatalf("wc -c read %q bytes", got)
	}

	ctx := guardCtx(t)
	ev, pid := mustStart(t, ctx, c, command("cat"))
	send := connect.NewRequest(&processpb.SendInputRequest{Process: pidSel(pid), Input: &processpb.ProcessInput{}})
	send.Header().Set(wire.StdinHeader, stage(t, srv, []byte("staged")))
	if _, err := c.SendInput(ctx, send); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: pidSel(pid)})); err != nil {
		t.Fatal(err)
	}
	o = &outcome{pid: pid}
	if err := collectRest(ev, o); err != nil || o.stdout.String() != "staged" {
		t.Fatalf("cat after a staged SendInput: %q %v", o.stdout.String(), err)
	}
}

// runStream runs a prepared Start request to its end, keeping its trailers
// in the outcome's stream.
func runStream(ctx context.Context, c interface {
	Start(context.Context, *connect.Request[processpb.StartRequest]) (*connect.ServerStreamForClient[processpb.StartResponse], error)
}, req *connect.Request[processpb.StartRequest]) (*outcome, error) {
	o, _, err := runStreamTrailers(ctx, c, req)
	return o, err
}

func runStreamTrailers(ctx context.Context, c interface {
	Start(context.Context, *connect.Request[processpb.StartRequest]) (*connect.ServerStreamForClient[processpb.StartResponse], error)
}, req *connect.Request[processpb.StartRequest]) (*outcome, http.Header, error) {
	s, err := c.Start(ctx, req)
	if err != nil {
		return nil, nil, err
	}
	defer s.Close()
	o, err := collect(startEvents(s))
	return o, s.ResponseTrailer(), err
}

// TestCollectedOutput proves collected output comes whole after the
// process ended (no data event before), stdout first, cut at the limit
// with the cut streams in the trailer, and that the trailers carry the
// run time.
func TestCollectedOutput(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	req := connect.NewRequest(shell("head -c 100000 /dev/zero | tr '\\0' o; echo err >&2; sleep 0.3; head -c 5000 /dev/zero | tr '\\0' p >&2"))
	req.Header().Set(wire.CollectHeader, "80000")
	s, err := c.Start(guardCtx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ev := startEvents(s)
	if _, err := expectStart(ev); err != nil {
		t.Fatal(err)
	}
	var order []string
	o := &outcome{}
	for {
		e, err := ev()
		if err != nil {
			t.Fatalf("no end event: %v", err)
		}
		if d := e.GetData(); d != nil {
			if d.GetStdout() != nil {
				o.stdout.Write(d.GetStdout())
				if len(order) == 0 || order[len(order)-1] != "stdout" {
					order = append(order, "stdout")
				}
			} else {
				o.stderr.Write(d.GetStderr())
				if len(order) == 0 || order[len(order)-1] != "stderr" {
					order = append(order, "stderr")
				}
			}
		}
		if e.GetEnd() != nil {
			break
		}
	}
	for s.Receive() {
	}
	if o.stdout.String() != strings.Repeat("o", 80000) || o.stderr.String() != "err\n"+strings.Repeat("p", 5000) {
		t.Fatalf("collected stdout %d bytes, stderr %.20q (%d bytes)", o.stdout.Len(), o.stderr.String(), o.stderr.Len())
	}
	if strings.Join(order, ",") != "stdout,stderr" {
		t.Fatalf("output order %v, want stdout then stderr", order)
	}
	tr := s.ResponseTrailer()
	if tr.Get(wire.TruncatedTrailer) != "stdout" {
		t.Fatalf("truncated trailer %q, want stdout", tr.Get(wire.TruncatedTrailer))
	}
	if ms, _ := strconv.Atoi(tr.Get(wire.DurationTrailer)); ms < 300 || ms > int(hangGuard/time.Millisecond) {
		t.Fatalf("duration trailer %q ms for a command that slept 300 ms", tr.Get(wire.DurationTrailer))
	}
}

// TestConnectTrailers proves a re-attached stream that ends with the
// process carries its CPU time and its whole run time, not the time since
// the re-attach.
func TestConnectTrailers(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	ctx := guardCtx(t)
	start, pid := mustStart(t, ctx, c, shell("i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done; sleep 0.5"))
	_ = start
	time.Sleep(200 * time.Millisecond)
	s, err := c.Connect(ctx, connect.NewRequest(&processpb.ConnectRequest{Process: pidSel(pid)}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := collect(connectEvents(s)); err != nil {
		t.Fatal(err)
	}
	tr := s.ResponseTrailer()
	cpu, _ := strconv.Atoi(tr.Get(wire.CPUTrailer))
	ran, _ := strconv.Atoi(tr.Get(wire.DurationTrailer))
	if cpu <= 0 || ran < 500 {
		t.Fatalf("trailers cpu %q ms, duration %q ms; want CPU used and the whole run", tr.Get(wire.CPUTrailer), tr.Get(wire.DurationTrailer))
	}
}

// TestStageRefusedPastMemory proves a stage larger than the sandbox's free
// memory is refused (507) rather than written until the kernel kills.
func TestStageRefusedPastMemory(t *testing.T) {
	free, ok := memoryFree()
	if !ok {
		t.Skip("this host shows no free memory figure")
	}
	_, _, srv := newProcessAgentServer(t, wire.Config{})
	// The check comes before the body is read: with Expect: 100-continue
	// the client sends none of it.
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/stage", io.LimitReader(zeros{}, free))
	req.ContentLength = free
	req.Header.Set("Expect", "100-continue")
	tr := srv.Client().Transport.(*http.Transport).Clone()
	tr.ExpectContinueTimeout = hangGuard
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusInsufficientStorage {
		t.Fatalf("stage of %d MiB with %d MiB free: HTTP %d, want 507", free>>20, free>>20, resp.StatusCode)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
