package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
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

// hangGuard bounds every process test's streams so that a bug makes a test
// fail instead of hanging the run. It is not a performance assertion.
const hangGuard = 20 * time.Second

var (
	reaperMu    sync.Mutex
	testReaper  *reaper // one for the whole test binary
	reaperUsers int     // tests using it now
	reaperStop  func()  // stops its run loop and waits for that
)

// acquireReaper returns the test binary's reaper, running until t and every
// other test using it have ended. Two reapers running at once would steal
// each other's children (each waits for any child), so all test agents
// share this one, and it does not run while other tests run their own.
func acquireReaper(t *testing.T) *reaper {
	reaperMu.Lock()
	defer reaperMu.Unlock()
	if testReaper == nil {
		testReaper = newReaper()
	}
	if reaperUsers == 0 {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			testReaper.run(ctx)
		}()
		reaperStop = func() { cancel(); <-done }
	}
	reaperUsers++
	t.Cleanup(func() {
		reaperMu.Lock()
		defer reaperMu.Unlock()
		if reaperUsers--; reaperUsers == 0 {
			reaperStop()
		}
	})
	return testReaper
}

// newProcessAgent serves an agent for cfg (default user root) over plain
// HTTP/1.1 with the shared reaper, and returns it with a process client.
// When t ends, every process it still runs is killed and waited for.
func newProcessAgent(t *testing.T, cfg wire.Config) (*Agent, processpbconnect.ProcessClient) {
	t.Helper()
	a, c, _ := newProcessAgentServer(t, cfg)
	return a, c
}

// newProcessAgentServer is newProcessAgent that also returns the server,
// for the agent's plain HTTP endpoints.
func newProcessAgentServer(t *testing.T, cfg wire.Config) (*Agent, processpbconnect.ProcessClient, *httptest.Server) {
	t.Helper()
	requireRoot(t)
	if cfg.DefaultUser == "" {
		cfg.DefaultUser = "root"
	}
	a := New(cfg, slog.Default())
	a.reaper = acquireReaper(t)
	srv := httptest.NewUnstartedServer(a.Handler())
	srv.EnableHTTP2 = false
	srv.Start()
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		a.procs.signalAll(syscall.SIGKILL)
		a.procs.waitIdle(hangGuard)
	})
	return a, processpbconnect.NewProcessClient(srv.Client(), srv.URL), srv
}

// guardCtx returns a context bounded by hangGuard, cancelled when t ends.
func guardCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	t.Cleanup(cancel)
	return ctx
}

// command returns a StartRequest for cmd with args.
func command(cmd string, args ...string) *processpb.StartRequest {
	return &processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: cmd, Args: args}}
}

// shell returns a StartRequest running script with /bin/sh -c.
func shell(script string) *processpb.StartRequest { return command("/bin/sh", "-c", script) }

// next yields a stream's events; at the end of the stream it returns nil
// and the stream's error, or io.EOF for a clean end.
type next func() (*processpb.ProcessEvent, error)

// startEvents and connectEvents adapt a Start or Connect stream to next.
func startEvents(s *connect.ServerStreamForClient[processpb.StartResponse]) next { return events(s) }

func connectEvents(s *connect.ServerStreamForClient[processpb.ConnectResponse]) next {
	return events(s)
}

func events[T any, PT interface {
	*T
	GetEvent() *processpb.ProcessEvent
}](s *connect.ServerStreamForClient[T]) next {
	return func() (*processpb.ProcessEvent, error) {
		if s.Receive() {
			return PT(s.Msg()).GetEvent(), nil
		}
		if err := s.Err(); err != nil {
			return nil, err
		}
		return nil, io.EOF
	}
}

// mustStart starts req and reads its start event; the stream is closed
// when the test ends. It returns the remaining events and the pid.
func mustStart(t *testing.T, ctx context.Context, c processpbconnect.ProcessClient, req *processpb.StartRequest) (next, uint32) {
	t.Helper()
	s, err := c.Start(ctx, connect.NewRequest(req))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ev := startEvents(s)
	pid, err := expectStart(ev)
	if err != nil {
		t.Fatal(err)
	}
	return ev, pid
}

// outcome is what a process stream delivered.
type outcome struct {
	pid                 uint32
	stdout, stderr, pty bytes.Buffer
	end                 *processpb.ProcessEvent_EndEvent
}

// expectStart reads the first event, which must be start with a pid.
func expectStart(ev next) (uint32, error) {
	e, err := ev()
	if err != nil {
		return 0, fmt.Errorf("stream ended before the start event: %w", err)
	}
	if e.GetStart() == nil || e.GetStart().GetPid() == 0 {
		return 0, fmt.Errorf("first event is %v, want start with a pid", e)
	}
	return e.GetStart().GetPid(), nil
}

// collectRest reads events into o until the end event, which must be the
// last one of the stream.
func collectRest(ev next, o *outcome) error {
	for {
		e, err := ev()
		if err != nil {
			return fmt.Errorf("stream ended without an end event: %w", err)
		}
		switch {
		case e.GetData() != nil:
			d := e.GetData()
			switch d.GetOutput().(type) {
			case *processpb.ProcessEvent_DataEvent_Stdout:
				o.stdout.Write(d.GetStdout())
			case *processpb.ProcessEvent_DataEvent_Stderr:
				o.stderr.Write(d.GetStderr())
			case *processpb.ProcessEvent_DataEvent_Pty:
				o.pty.Write(d.GetPty())
			default:
				return fmt.Errorf("data event without output: %v", e)
			}
		case e.GetEnd() != nil:
			o.end = e.GetEnd()
			if e, err := ev(); !errors.Is(err, io.EOF) {
				return fmt.Errorf("after the end event: %v, %v", e, err)
			}
			return nil
		case e.GetKeepalive() != nil:
		case e.GetStart() != nil:
			return fmt.Errorf("a second start event: %v", e)
		default:
			return fmt.Errorf("empty event")
		}
	}
}

// collect reads a whole stream: start, data, end.
func collect(ev next) (*outcome, error) {
	pid, err := expectStart(ev)
	if err != nil {
		return nil, err
	}
	o := &outcome{pid: pid}
	return o, collectRest(ev, o)
}

// runProcess starts req as user ("" for the default) and returns the whole stream.
func runProcess(ctx context.Context, c processpbconnect.ProcessClient, req *processpb.StartRequest, user string) (*outcome, error) {
	r := connect.NewRequest(req)
	if user != "" {
		r = asUser(req, user)
	}
	s, err := c.Start(ctx, r)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	return collect(startEvents(s))
}

// mustRun is runProcess for the test goroutine: any failure is fatal.
func mustRun(t *testing.T, c processpbconnect.ProcessClient, req *processpb.StartRequest, user string) *outcome {
	t.Helper()
	o, err := runProcess(guardCtx(t), c, req, user)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// startErr starts req as user and returns the error the stream ends with
// (nil if the process started).
func startErr(t *testing.T, c processpbconnect.ProcessClient, req *processpb.StartRequest, user string) error {
	t.Helper()
	_, err := runProcess(guardCtx(t), c, req, user)
	return err
}

// wantExit fails t unless o ended with a normal exit with code.
func wantExit(t *testing.T, o *outcome, code int32) {
	t.Helper()
	e := o.end
	status := "exit status " + strconv.Itoa(int(code))
	if e.GetExitCode() != code || !e.GetExited() || e.GetStatus() != status {
		t.Fatalf("end = %v, want exited with %q (stdout %q, stderr %q)", e, status, o.stdout.String(), o.stderr.String())
	}
	if code == 0 && e.Error != nil {
		t.Fatalf("end error = %q for a zero exit", e.GetError())
	}
	if code != 0 && e.GetError() != status {
		t.Fatalf("end error = %v, want %q", e.Error, status)
	}
}

// pidSel and tagSel build process selectors.
func pidSel(pid uint32) *processpb.ProcessSelector {
	return &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: pid}}
}

func tagSel(tag string) *processpb.ProcessSelector {
	return &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Tag{Tag: tag}}
}

// listed returns the List entry for pid, or nil.
func listed(t *testing.T, c processpbconnect.ProcessClient, pid uint32) *processpb.ProcessInfo {
	t.Helper()
	resp, err := c.List(guardCtx(t), connect.NewRequest(&processpb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range resp.Msg.GetProcesses() {
		if p.GetPid() == pid {
			return p
		}
	}
	return nil
}

// eventually polls cond until it holds or hangGuard passes, then fails t
// with what. The bound is a hang guard, not a timing assertion.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never happened: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// procState returns the state letter of /proc/<pid>/stat ("" when the pid is gone).
func procState(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	// pid (comm) S ...; comm may contain spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// dead reports whether pid has exited (gone, or a zombie nobody reaped yet).
func dead(pid int) bool {
	st := procState(pid)
	return st == "" || st == "Z" || st == "X"
}

// childrenOfSelf lists the pids of the test process's children, from
// /proc/self/task/*/children.
func childrenOfSelf(t *testing.T) []int {
	t.Helper()
	files, err := filepath.Glob("/proc/self/task/*/children")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // the thread exited
		}
		for _, s := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(s); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}
