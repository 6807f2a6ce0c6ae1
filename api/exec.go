package api

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/api/access"
	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/audit"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/sandbox"
)

// maxCollectedOutput caps each of stdout and stderr in a JSON exec result,
// in bytes; output beyond it is dropped and the result says so.
const maxCollectedOutput = 16 << 20

// wantsJSON reports whether the client asked for one JSON result instead of
// an event stream.
func wantsJSON(r *http.Request) bool {
	a := r.Header.Get("Accept")
	return strings.Contains(a, "application/json") && !strings.Contains(a, "text/event-stream")
}

// sseOutput streams exec events as server-sent events:
//
//	event: start   data: {"pid":N}
//	event: stdout  data: <base64 of the raw bytes>
//	event: stderr  data: <base64 of the raw bytes>
//	event: exit    data: <ExecResult JSON>
//	event: error   data: <v1.Problem JSON> (the exec failed after it started)
//
// Output is base64 so that every byte arrives unchanged (SSE is text).
type sseOutput struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	mu sync.Mutex
}

func newSSE(w http.ResponseWriter) *sseOutput {
	return &sseOutput{w: w, rc: http.NewResponseController(w)}
}

func (o *sseOutput) event(name, data string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, err := fmt.Fprintf(o.w, "event: %s\ndata: %s\n\n", name, data); err != nil {
		return err
	}
	return o.rc.Flush()
}

func (o *sseOutput) Started(pid int) error {
	h := o.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	o.w.WriteHeader(http.StatusOK)
	return o.event("start", fmt.Sprintf(`{"pid":%d}`, pid))
}

func (o *sseOutput) Stdout(p []byte) error {
	return o.event("stdout", base64.StdEncoding.EncodeToString(p))
}

func (o *sseOutput) Stderr(p []byte) error {
	return o.event("stderr", base64.StdEncoding.EncodeToString(p))
}

func (o *sseOutput) jsonEvent(name string, v any) error {
	b, _ := json.Marshal(v)
	return o.event(name, string(b))
}

// collector gathers output for a JSON result.
type collector struct {
	resp    v1.ExecOutput
	started bool
}

func (c *collector) Started(pid int) error { c.started = true; return nil }
func (c *collector) Stdout(p []byte) error {
	c.resp.Stdout, c.resp.StdoutTruncated = appendCapped(c.resp.Stdout, p, c.resp.StdoutTruncated)
	return nil
}
func (c *collector) Stderr(p []byte) error {
	c.resp.Stderr, c.resp.StderrTruncated = appendCapped(c.resp.Stderr, p, c.resp.StderrTruncated)
	return nil
}

func appendCapped(buf, p []byte, truncated bool) ([]byte, bool) {
	room := maxCollectedOutput - len(buf)
	if len(p) > room {
		return append(buf, p[:room]...), true
	}
	return append(buf, p...), truncated
}

// handleExec: POST /v1/sessions/{id}/exec with a v1.ExecRequest.
// Background commands answer 202 {"pid": N} at once.
func (s *Server) handleExec(w http.ResponseWriter, r *http.Request) {
	var req v1.ExecRequest
	if err := decodeJSON(r, &req, maxExecBody, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	id := r.PathValue("id")
	note := access.NoteFrom(r.Context())
	hash := audit.CommandHash(req.Argv...)
	if req.Cmd != "" {
		hash = audit.CommandHash("/bin/sh", "-c", req.Cmd)
	}
	note.Set("command_sha256", hash)
	if req.User != "" {
		note.Set("user", req.User)
	}
	// The command is on record before it runs: a daemon that dies while
	// it runs loses only its result.
	if _, err := s.mgr.Get(r.Context(), id); err == nil {
		if err := s.audit.Record(r.Context(), audit.Event{Session: id, Kind: "exec.start",
			Detail: map[string]any{"command_sha256": hash, "user": req.User, "stdin_bytes": len(req.Stdin)}}); err != nil {
			s.writeError(w, r, err) // no command runs unrecorded
			return
		}
	}
	if req.Background {
		res, err := s.mgr.Exec(r.Context(), id, req, sandbox.OutputFuncs(nil, nil, nil))
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		note.Set("background", true)
		note.Set("pid", res.Pid)
		writeJSON(w, http.StatusAccepted, v1.BackgroundStarted{Pid: res.Pid, Tag: req.Tag})
		return
	}
	began := time.Now()
	s.respondExec(w, r, func(out sandbox.Output) (*v1.ExecResult, error) {
		res, err := s.mgr.Exec(r.Context(), id, req, out)
		if err == nil {
			s.metrics.ObserveExec(time.Since(began))
			note.Set("pid", res.Pid)
			note.Set("exit_code", res.ExitCode)
			note.Set("cpu_ms", res.CPUMS)
			note.Set("duration_ms", res.DurationMS)
			if res.TimedOut {
				note.Set("timed_out", true)
			}
			if res.OOMKilled {
				note.Set("oom_killed", true)
			}
		}
		return res, err
	})
}

// respondExec runs fn and answers with one JSON result when the client
// asked for it (Accept: application/json), else with the event stream.
func (s *Server) respondExec(w http.ResponseWriter, r *http.Request, fn func(sandbox.Output) (*v1.ExecResult, error)) {
	if !wantsJSON(r) {
		s.streamExec(w, r, fn)
		return
	}
	c := &collector{}
	res, err := fn(c)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	c.resp.ExecResult = *res
	writeJSON(w, http.StatusOK, c.resp)
}

// streamExec runs fn with an SSE output. Errors before the stream started
// are problem responses; later ones become an error event.
func (s *Server) streamExec(w http.ResponseWriter, r *http.Request, fn func(sandbox.Output) (*v1.ExecResult, error)) {
	out := newSSE(w)
	started := false
	tracked := sandbox.OutputFuncs(func(pid int) error { started = true; return out.Started(pid) }, out.Stdout, out.Stderr)
	res, err := fn(tracked)
	if err != nil {
		if !started {
			s.writeError(w, r, err)
			return
		}
		if r.Context().Err() == nil {
			p := s.problemOf(r, err)
			p.Instance, p.RequestID = r.URL.Path, w.Header().Get(requestIDHeader)
			_ = out.jsonEvent("error", p)
		}
		return
	}
	_ = out.jsonEvent("exit", res)
}

// maxPid is Linux's largest possible pid (PID_MAX_LIMIT). Larger numbers
// must not reach the agent, whose protocol carries pids as uint32 (2^32+1
// would name pid 1).
const maxPid = 1 << 22

func pidParam(r *http.Request) (int, error) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid < 1 || pid > maxPid {
		return 0, errdefs.InvalidField("pid", "must be a process id between 1 and %d", maxPid)
	}
	return pid, nil
}

func (s *Server) handleProcesses(w http.ResponseWriter, r *http.Request) {
	ps, err := s.mgr.Processes(r.Context(), r.PathValue("id"))
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v1.ProcessList{Processes: ps})
}

// handleAttach: GET /v1/sessions/{id}/processes/{pid}/stream re-attaches to
// a command: its output from now on and its exit, as SSE (or one JSON
// result with Accept: application/json). Disconnecting leaves it running.
func (s *Server) handleAttach(w http.ResponseWriter, r *http.Request) {
	pid, err := pidParam(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	id := r.PathValue("id")
	s.respondExec(w, r, func(out sandbox.Output) (*v1.ExecResult, error) {
		return s.mgr.Attach(r.Context(), id, pid, out)
	})
}

// handleSignal: POST .../processes/{pid}/signal {"signal": 9|15}.
func (s *Server) handleSignal(w http.ResponseWriter, r *http.Request) {
	pid, err := pidParam(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req v1.Signal
	if err := decodeJSON(r, &req, maxJSONBody, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.mgr.Signal(r.Context(), r.PathValue("id"), pid, req.Signal); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleKill: DELETE .../processes/{pid} kills the command's process group.
func (s *Server) handleKill(w http.ResponseWriter, r *http.Request) {
	pid, err := pidParam(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.mgr.Signal(r.Context(), r.PathValue("id"), pid, 9); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleStdin: POST .../processes/{pid}/stdin {"data": base64, "close": bool}.
func (s *Server) handleStdin(w http.ResponseWriter, r *http.Request) {
	pid, err := pidParam(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var req v1.StdinRequest
	if err := decodeJSON(r, &req, maxExecBody, false); err != nil {
		s.writeError(w, r, err)
		return
	}
	access.NoteFrom(r.Context()).Set("bytes", len(req.Data))
	if err := s.mgr.SendStdin(r.Context(), r.PathValue("id"), pid, req.Data, req.Close); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
