package guest

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// output is a node.Output that keeps what it gets.
type output struct {
	mu             sync.Mutex
	stdout, stderr bytes.Buffer
	fail           error // returned by Stdout when set
}

func (o *output) Started(int) error { return nil }

func (o *output) Stdout(p []byte) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.fail != nil {
		return o.fail
	}
	o.stdout.Write(p)
	return nil
}

func (o *output) Stderr(p []byte) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stderr.Write(p)
	return nil
}

var _ node.Output = (*output)(nil)

// run starts o, follows it to its end and returns the end, the output and
// the trailer.
func run(t *testing.T, c *Client, o StartOpts) (*Exit, *output, Trailer) {
	t.Helper()
	s, err := c.Start(guard(t), o)
	if err != nil {
		t.Fatalf("start %v: %v", o.Args, err)
	}
	defer s.Close()
	if s.Pid() <= 0 {
		t.Fatalf("pid %d", s.Pid())
	}
	out := &output{}
	end, err := s.Follow(out)
	if err != nil {
		t.Fatalf("follow: %v", err)
	}
	return end, out, s.Finish()
}

func sh(script string) StartOpts {
	return StartOpts{Cmd: "/bin/sh", Args: []string{"-c", script}, User: "root"}
}

// TestStartStreamsOutputAndExit: a process's stdout and stderr arrive
// apart, its exit code in its end, its CPU and run time in the trailer.
func TestStartStreamsOutputAndExit(t *testing.T) {
	_, c := startAgent(t)
	end, out, tr := run(t, c, sh(`echo out; echo err >&2; i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exit 3`))
	if end.Code != 3 || end.Signal != 0 || end.Status != "exit status 3" {
		t.Fatalf("end %+v, want exit status 3", end)
	}
	if out.stdout.String() != "out\n" || out.stderr.String() != "err\n" {
		t.Fatalf("stdout %q stderr %q", out.stdout.String(), out.stderr.String())
	}
	if !tr.HasDuration || tr.CPUMS < 0 || tr.TruncatedStdout || tr.TruncatedStderr {
		t.Fatalf("trailer %+v", tr)
	}
	// Env, cwd and user reach the process.
	o := sh(`echo "$FOO $(pwd) $(id -u)"`)
	o.Env, o.Cwd, o.User = map[string]string{"FOO": "bar"}, "/", "1000"
	if _, out, _ := run(t, c, o); out.stdout.String() != "bar / 1000\n" {
		t.Fatalf("env, cwd, user: %q", out.stdout.String())
	}
}

// TestStartRefusals: what the agent refuses comes back classified, with
// the field it is about.
func TestStartRefusals(t *testing.T) {
	_, c := startAgent(t)
	ctx := guard(t)
	o := sh("true")
	o.Cwd = "/no/such/dir"
	_, err := c.Start(ctx, o)
	if StartField(err, "cmd") != "cwd" {
		t.Fatalf("bad cwd: field %q of %v", StartField(err, "cmd"), err)
	}
	if ce := Classify(ctx, err, "cwd"); errdefs.Field(ce) != "cwd" {
		t.Fatalf("bad cwd classified as %v", ce)
	}
	_, err = c.Start(ctx, StartOpts{Cmd: "/no/such/program", User: "root"})
	if f := StartField(err, "argv"); f != "argv" {
		t.Fatalf("bad program: field %q of %v", f, err)
	}
	o = sh("true")
	o.User = "nobody-such-user"
	_, err = c.Start(ctx, o)
	if ce := Classify(ctx, err, ""); errdefs.Field(ce) != "user" {
		t.Fatalf("unknown user classified as %v", ce)
	}
	if k, _ := KindOf(Classify(ctx, err, "")); k != Refused {
		t.Fatalf("unknown user is %s, want refused", k)
	}
}

// TestSignalEndsProcess: SIGKILL and SIGTERM end a process, which reads
// as 128+N; other signals are refused before the agent is asked.
func TestSignalEndsProcess(t *testing.T) {
	_, c := startAgent(t)
	ctx := guard(t)
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGTERM} {
		s, err := c.Start(ctx, StartOpts{Cmd: "sleep", Args: []string{"100"}, User: "root"})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Signal(ctx, s.Pid(), sig); err != nil {
			t.Fatalf("signal %d: %v", sig, err)
		}
		end, err := s.Follow(&output{})
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		if end.Signal != int(sig) || end.Code != 128+int(sig) {
			t.Fatalf("after signal %d: end %+v", sig, end)
		}
	}
	err := c.Signal(ctx, 1, syscall.SIGHUP)
	if errdefs.Field(err) != "signal" {
		t.Fatalf("SIGHUP: %v, want a signal field error", err)
	}
	if err := c.Signal(ctx, 999999, syscall.SIGKILL); !errors.Is(Classify(ctx, err, ""), errdefs.ErrNotFound) {
		t.Fatalf("signal to no process: %v", err)
	}
}

// TestStdin: input written to a process's stdin, and a staged script and
// staged stdin, reach it in order.
func TestStdin(t *testing.T) {
	_, c := startAgent(t)
	ctx := guard(t)
	s, err := c.Start(ctx, StartOpts{Cmd: "cat", User: "root", Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	big := bytes.Repeat([]byte("x"), stdinChunk+10) // two messages
	if err := c.WriteStdin(ctx, s.Pid(), []byte("hello "), false); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteStdin(ctx, s.Pid(), big, true); err != nil {
		t.Fatal(err)
	}
	out := &output{}
	end, err := s.Follow(out)
	if err != nil || end.Code != 0 {
		t.Fatalf("cat: %+v %v", end, err)
	}
	if want := "hello " + string(big); out.stdout.String() != want {
		t.Fatalf("cat got %d bytes, want %d", out.stdout.Len(), len(want))
	}

	script, err := c.Stage(ctx, strings.NewReader(`read line; echo "script got $line"; cat`))
	if err != nil || script.ID == "" {
		t.Fatalf("stage: %+v %v", script, err)
	}
	in, err := c.Stage(ctx, strings.NewReader("first\n"))
	if err != nil || in.Size != 6 {
		t.Fatalf("stage stdin: %+v %v", in, err)
	}
	s2, err := c.Start(ctx, StartOpts{Cmd: "/bin/sh", User: "root", Stdin: true, Script: script.ID, StdinStage: in.ID, KeepStdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	more, err := c.Stage(ctx, strings.NewReader("second\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.WriteStaged(ctx, s2.Pid(), more.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.WriteStdin(ctx, s2.Pid(), []byte("third\n"), true); err != nil {
		t.Fatal(err)
	}
	out = &output{}
	if end, err := s2.Follow(out); err != nil || end.Code != 0 {
		t.Fatalf("script: %+v %v", end, err)
	}
	if got := out.stdout.String(); got != "script got first\nsecond\nthird\n" {
		t.Fatalf("script output %q", got)
	}
	// A staged input is taken once: naming it again is refused.
	if _, err := c.Start(ctx, StartOpts{Cmd: "/bin/sh", User: "root", Script: script.ID}); err == nil {
		t.Fatal("a taken stage was used twice")
	}
	// Unstaged inputs are gone.
	left, err := c.Stage(ctx, strings.NewReader("echo never"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Unstage(ctx, left.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Start(ctx, StartOpts{Cmd: "/bin/sh", User: "root", Script: left.ID}); err == nil {
		t.Fatal("an unstaged input still ran")
	}
}

// TestConnectListAndCollect: a running process is listed with its tag, a
// second stream attaches to it and gets its end and run time; collected
// output comes after the end, cut at the limit.
func TestConnectListAndCollect(t *testing.T) {
	_, c := startAgent(t)
	ctx := guard(t)
	s, err := c.Start(ctx, StartOpts{Cmd: "sleep", Args: []string{"100"}, User: "root", Tag: "napper"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	list, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(list, func(p node.Process) bool {
		return p.Pid == s.Pid() && p.Tag == "napper" && p.Cmd == "sleep" && slices.Equal(p.Args, []string{"100"})
	}) {
		t.Fatalf("list %+v lacks pid %d", list, s.Pid())
	}
	att, err := c.Connect(ctx, s.Pid(), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer att.Close()
	time.Sleep(50 * time.Millisecond) // (some run time to measure)
	if err := c.Signal(ctx, s.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	end, err := att.Follow(&output{})
	if err != nil || end.Signal != int(syscall.SIGTERM) {
		t.Fatalf("attached end %+v %v", end, err)
	}
	if tr := att.Finish(); !tr.HasDuration || tr.DurationMS < 50 {
		t.Fatalf("attached trailer %+v, want the run time", tr)
	}
	if _, err := c.Connect(ctx, 999999, 0); !errors.Is(Classify(ctx, err, ""), errdefs.ErrNotFound) {
		t.Fatalf("connect to no process: %v", err)
	}

	o := sh(`printf 0123456789; printf abc >&2`)
	o.Collect = 4
	end, out, tr := run(t, c, o)
	if end.Code != 0 || out.stdout.String() != "0123" || out.stderr.String() != "abc" {
		t.Fatalf("collected: %+v %q %q", end, out.stdout.String(), out.stderr.String())
	}
	if !tr.TruncatedStdout || tr.TruncatedStderr {
		t.Fatalf("collected trailer %+v, want stdout cut only", tr)
	}
}

// TestFollowOutputError: an error of the caller's output stops the copy
// as ErrOutput, which Classify leaves alone.
func TestFollowOutputError(t *testing.T) {
	_, c := startAgent(t)
	ctx := guard(t)
	s, err := c.Start(ctx, sh("echo x; sleep 100"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer c.Signal(ctx, s.Pid(), syscall.SIGKILL)
	_, err = s.Follow(&output{fail: errors.New("client gone")})
	if !errors.Is(err, ErrOutput) || Classify(ctx, err, "") != err {
		t.Fatalf("follow with a failing output: %v", err)
	}
}
