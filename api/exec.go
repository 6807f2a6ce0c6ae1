package api

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/api/access"
	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/node"

	"github.com/forkbox/forkbox/errdefs"
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

// begin sends the 200 of an event stream: its content type, no caching,
// no proxy buffering. Call it once, before the first event.
func (o *sseOutput) begin() {
	hd := o.w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Accel-Buffering", "no")
	o.w.WriteHeader(http.StatusOK)
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
	o.begin()
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

// jsonResult writes a JSON-mode exec answer (v1.ExecOutput) as a stream.
// It is a node.Collector: the agent holds the output until the command
// ends and then sends it, stdout first, and it goes out base64-encoded as
// it comes, so that the daemon never holds a result. The answer's members
// come in the order stdout, stderr, then the result's; the status is
// decided when the first output arrives, which is after the command ended.
type jsonResult struct {
	w                  http.ResponseWriter
	begun              bool // the 200 and the opening brace are out
	open               string
	enc                io.WriteCloser // base64 of the open member
	err                error          // the first write error
	truncOut, truncErr bool
}

// CollectLimit is the most bytes of each stream a JSON result holds.
func (j *jsonResult) CollectLimit() int64 { return maxCollectedOutput }

// Truncated records which streams were cut.
func (j *jsonResult) Truncated(stdout, stderr bool) { j.truncOut, j.truncErr = stdout, stderr }

// Started does nothing: a JSON result has no start event.
func (j *jsonResult) Started(int) error { return nil }

// Stdout and Stderr stream output into the answer.
func (j *jsonResult) Stdout(p []byte) error { return j.output("stdout", p) }
func (j *jsonResult) Stderr(p []byte) error { return j.output("stderr", p) }

func (j *jsonResult) output(member string, p []byte) error {
	if j.open != member {
		j.switchTo(member)
	}
	if j.err == nil {
		_, j.err = j.enc.Write(p)
	}
	return j.err
}

// write writes s unless a write failed already.
func (j *jsonResult) write(s string) {
	if j.err == nil {
		_, j.err = io.WriteString(j.w, s)
	}
}

// switchTo ends the open member and opens member.
func (j *jsonResult) switchTo(member string) {
	if !j.begun {
		j.w.Header().Set("Content-Type", "application/json")
		j.w.WriteHeader(http.StatusOK)
		j.write("{")
		j.begun = true
	} else {
		j.closeMember()
		j.write(",")
	}
	j.write(`"` + member + `":"`)
	j.open, j.enc = member, base64.NewEncoder(base64.StdEncoding, writerFunc(func(b []byte) (int, error) {
		if j.err != nil {
			return 0, j.err
		}
		n, err := j.w.Write(b)
		j.err = err
		return n, err
	}))
}

func (j *jsonResult) closeMember() {
	if j.enc != nil {
		if err := j.enc.Close(); err != nil && j.err == nil {
			j.err = err
		}
		j.write(`"`)
		j.enc, j.open = nil, ""
	}
}

// finish writes the rest of a successful answer.
func (j *jsonResult) finish(res *v1.ExecResult) {
	if !j.begun {
		writeJSON(j.w, http.StatusOK, v1.ExecOutput{ExecResult: *res, StdoutTruncated: j.truncOut, StderrTruncated: j.truncErr,
			Stdout: []byte{}, Stderr: []byte{}})
		return
	}
	had := j.open
	j.closeMember()
	if had == "stdout" {
		j.write(`,"stderr":""`)
	}
	rest, _ := json.Marshal(struct {
		*v1.ExecResult
		StdoutTruncated bool `json:"stdout_truncated,omitempty"`
		StderrTruncated bool `json:"stderr_truncated,omitempty"`
	}{res, j.truncOut, j.truncErr})
	j.write("," + string(rest[1:]) + "\n")
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// handleExec: POST /v1/sessions/{id}/exec with a v1.ExecRequest, read as
// a stream (execbody.go): a long command text or stdin data goes on into
// the sandbox while it arrives. The exec holds its body's bytes in the
// in-flight budget meanwhile (429 exec-inflight-exceeded past a bound,
// before any of it is read). Background commands answer 202 {"pid": N} at
// once.
func (h *execAPI) handleExec(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	prep, err := h.mgr.PrepareExec(r.Context(), id, r.ContentLength)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	defer prep.Close()
	body, err := readExecBody(r, prep)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	prep.BodyDone()
	req := body.req
	note := access.NoteFrom(r.Context())
	note.Set("command_sha256", body.hash)
	if req.User != "" {
		note.Set("user", req.User)
	}
	// The command is on record before it runs: a daemon that dies while
	// it runs loses only its result.
	if err := h.audit.Record(r.Context(), audit.Event{Session: id, Kind: "exec.start",
		Detail: map[string]any{"command_sha256": body.hash, "user": req.User, "stdin_bytes": body.stdinBytes}}); err != nil {
		h.writeError(w, r, err) // no command runs unrecorded
		return
	}
	if req.Background {
		res, err := prep.Exec(r.Context(), node.ExecSpec(req), body.in, node.OutputFuncs(nil, nil, nil))
		if err != nil {
			h.writeError(w, r, err)
			return
		}
		note.Set("background", true)
		note.Set("pid", res.Pid)
		writeJSON(w, http.StatusAccepted, v1.BackgroundStarted{Pid: res.Pid, Tag: req.Tag})
		return
	}
	began := time.Now()
	h.respondExec(w, r, func(out node.Output) (*node.ExecResult, error) {
		res, err := prep.Exec(r.Context(), node.ExecSpec(req), body.in, out)
		if err == nil {
			h.metrics.ObserveExec(time.Since(began))
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
func (h *execAPI) respondExec(w http.ResponseWriter, r *http.Request, fn func(node.Output) (*node.ExecResult, error)) {
	if !wantsJSON(r) {
		h.streamExec(w, r, fn)
		return
	}
	j := &jsonResult{w: w}
	res, err := fn(j)
	switch {
	case err != nil && !j.begun:
		h.writeError(w, r, err)
	case err != nil:
		// The answer is under way (its output was being sent): it is left
		// unfinished, so the client sees a broken body, not a result.
		p := ProblemFor(err)
		access.NoteFrom(r.Context()).Failed(strings.TrimPrefix(p.Type, problemPath), p.Detail)
		h.log.Warn("exec answer cut", "path", r.URL.Path, "request_id", w.Header().Get(requestIDHeader), "err", err)
	default:
		j.finish(execResult(res))
	}
}

// streamExec runs fn with an SSE output. Errors before the stream started
// are problem responses; later ones become an error event.
func (h *execAPI) streamExec(w http.ResponseWriter, r *http.Request, fn func(node.Output) (*node.ExecResult, error)) {
	out := newSSE(w)
	started := false
	tracked := node.OutputFuncs(func(pid int) error { started = true; return out.Started(pid) }, out.Stdout, out.Stderr)
	res, err := fn(tracked)
	if err != nil {
		if !started {
			h.writeError(w, r, err)
			return
		}
		if r.Context().Err() == nil {
			p := h.problemOf(r, err)
			p.Instance, p.RequestID = r.URL.Path, w.Header().Get(requestIDHeader)
			_ = out.jsonEvent("error", p)
		}
		return
	}
	_ = out.jsonEvent("exit", execResult(res))
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

func (h *execAPI) handleProcesses(w http.ResponseWriter, r *http.Request) {
	ps, err := h.mgr.ProcessList(r.Context(), r.PathValue("id"))
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v1.ProcessList{Processes: processes(ps)})
}

// handleAttach: GET /v1/sessions/{id}/processes/{pid}/stream re-attaches to
// a command: its output from now on and its exit, as SSE (or one JSON
// result with Accept: application/json). Disconnecting leaves it running.
func (h *execAPI) handleAttach(w http.ResponseWriter, r *http.Request) {
	pid, err := pidParam(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	id := r.PathValue("id")
	h.respondExec(w, r, func(out node.Output) (*node.ExecResult, error) {
		return h.mgr.Attach(r.Context(), id, pid, out)
	})
}

// handleSignal: POST .../processes/{pid}/signal {"signal": 9|15}.
func (h *execAPI) handleSignal(w http.ResponseWriter, r *http.Request) {
	pid, err := pidParam(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	var req v1.Signal
	if err := decodeJSON(r, &req, maxJSONBody, false); err != nil {
		h.writeError(w, r, err)
		return
	}
	if err := h.mgr.Signal(r.Context(), r.PathValue("id"), pid, req.Signal); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleKill: DELETE .../processes/{pid} kills the command's process group.
func (h *execAPI) handleKill(w http.ResponseWriter, r *http.Request) {
	pid, err := pidParam(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if err := h.mgr.Signal(r.Context(), r.PathValue("id"), pid, 9); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// handleStdin: POST .../processes/{pid}/stdin {"data": base64, "close": bool},
// read as a stream like an exec body.
func (h *execAPI) handleStdin(w http.ResponseWriter, r *http.Request) {
	pid, err := pidParam(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	prep, err := h.mgr.PrepareExec(r.Context(), r.PathValue("id"), r.ContentLength)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	defer prep.Close()
	inline, staged, closeAfter, size, err := readStdinBody(r, prep)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	prep.BodyDone()
	access.NoteFrom(r.Context()).Set("bytes", size)
	if err := prep.SendStdin(r.Context(), pid, inline, staged, closeAfter); err != nil {
		h.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
