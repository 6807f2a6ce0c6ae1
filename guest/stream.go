package guest

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/internal/envdpb/processpb"
	"github.com/forkbox/forkbox/node"
)

// Stream is the event stream of one process (Client.Start or
// Client.Connect), already past its first event. It is not safe for
// concurrent use; Close it when done.
type Stream struct {
	pid     int
	receive func() bool
	event   func() *processpb.ProcessEvent
	err     func() error
	trailer func() http.Header
	close   func() error
}

// Pid returns the process's pid in the sandbox.
func (s *Stream) Pid() int { return s.pid }

// Event is one event of a process's stream: a chunk of output (Stdout or
// Stderr; a terminal's output counts as Stdout), or its end.
type Event struct {
	Stdout, Stderr []byte
	// End is set on the process's end event, which is the last.
	End *Exit
}

// Exit is how a process ended. A death by signal N (envd: "signal:
// killed", exit code -1) is Code 128+N with Signal N; an end the agent
// could not explain is Code 255.
type Exit struct {
	Code   int
	Signal int
	// Status is envd's text ("exit status 3", "signal: killed").
	Status string
}

// Next returns the stream's next data or end event. ok is false when the
// stream ended; Err then says why (nil: it ended cleanly). Other events
// (keepalives) are skipped.
func (s *Stream) Next() (ev Event, ok bool) {
	for s.receive() {
		e := s.event()
		switch {
		case e.GetData() != nil:
			switch o := e.GetData().GetOutput().(type) {
			case *processpb.ProcessEvent_DataEvent_Stdout:
				return Event{Stdout: o.Stdout}, true
			case *processpb.ProcessEvent_DataEvent_Stderr:
				return Event{Stderr: o.Stderr}, true
			case *processpb.ProcessEvent_DataEvent_Pty:
				return Event{Stdout: o.Pty}, true
			}
		case e.GetEnd() != nil:
			return Event{End: exitOf(e.GetEnd())}, true
		}
	}
	return Event{}, false
}

// Err returns the error that ended the stream, unclassified (Classify);
// nil when it ended cleanly or has not ended.
func (s *Stream) Err() error { return s.err() }

// Follow copies the stream's output to out until the process's end, which
// it returns. An error of out is returned wrapped in ErrOutput; a stream
// that breaks returns its error, and one that ends without an end event an
// ErrUnavailable, both unclassified (Classify).
func (s *Stream) Follow(out node.Output) (*Exit, error) {
	for {
		ev, ok := s.Next()
		if !ok {
			break
		}
		var err error
		switch {
		case ev.End != nil:
			return ev.End, nil
		case ev.Stdout != nil:
			err = out.Stdout(ev.Stdout)
		case ev.Stderr != nil:
			err = out.Stderr(ev.Stderr)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrOutput, err)
		}
	}
	if err := s.err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("agent stream ended without an end event: %w", errdefs.ErrUnavailable)
}

// Trailer is what the agent sends after a process's end event.
type Trailer struct {
	// CPUMS is the process group's CPU time in milliseconds (0: unknown).
	CPUMS int64
	// DurationMS is the process's whole run time in milliseconds as the
	// agent measured it; HasDuration says it came.
	DurationMS  int64
	HasDuration bool
	// TruncatedStdout and TruncatedStderr say which collected streams were
	// cut (at the limit, or where the sandbox had no memory for more).
	TruncatedStdout, TruncatedStderr bool
}

// Finish reads the stream to its end (the agent ends it right after the
// end event) and returns its trailer.
func (s *Stream) Finish() Trailer {
	for s.receive() {
	}
	h := s.trailer()
	var t Trailer
	t.CPUMS, _ = strconv.ParseInt(h.Get(wire.CPUTrailer), 10, 64)
	if ms, err := strconv.ParseInt(h.Get(wire.DurationTrailer), 10, 64); err == nil {
		t.DurationMS, t.HasDuration = ms, true
	}
	cut := h.Get(wire.TruncatedTrailer)
	t.TruncatedStdout, t.TruncatedStderr = strings.Contains(cut, "stdout"), strings.Contains(cut, "stderr")
	return t
}

// Close ends the stream (the process keeps running).
func (s *Stream) Close() error { return s.close() }

// exitOf converts envd's end event.
func exitOf(end *processpb.ProcessEvent_EndEvent) *Exit {
	x := &Exit{Status: end.GetStatus()}
	if end.GetExited() {
		x.Code = int(end.GetExitCode())
		return x
	}
	if n := signalNumber(end.GetStatus()); n > 0 {
		x.Signal, x.Code = n, 128+n
		return x
	}
	x.Code = 255
	return x
}

// signalNames maps Go's signal descriptions ("killed", "terminated") to
// numbers, as the agent writes them into an end event's status.
var signalNames = func() map[string]int {
	m := map[string]int{}
	for i := 1; i < 65; i++ {
		m[syscall.Signal(i).String()] = i
	}
	return m
}()

// signalNumber parses "signal: killed" or "signal: segmentation fault
// (core dumped)"; 0 when status is not a signal death.
func signalNumber(status string) int {
	name, ok := strings.CutPrefix(status, "signal: ")
	if !ok {
		return 0
	}
	name = strings.TrimSuffix(name, " (core dumped)")
	return signalNames[name]
}
