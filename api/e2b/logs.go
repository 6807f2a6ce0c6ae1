package e2b

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/httpjson"
	"github.com/forkbox/forkbox/node"
)

// Log paging: E2B's default and cap of lines per answer.
const (
	defaultLogLimit = 1000
	maxLogLimit     = 10000
)

// sandboxLog is components.schemas.SandboxLog: a line of JSON (what the
// e2b CLI's `sandbox logs` parses: level, logger, message and fields).
type sandboxLog struct {
	Timestamp time.Time `json:"timestamp"`
	Line      string    `json:"line"`
}

// sandboxLogEntry is components.schemas.SandboxLogEntry.
type sandboxLogEntry struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// logLevels orders components.schemas.LogLevel.
var logLevels = map[string]int{"debug": 0, "info": 1, "warn": 2, "error": 3}

func entryOf(l node.LogLine) sandboxLogEntry {
	fields := l.Fields
	if fields == nil {
		fields = map[string]string{}
	}
	level := l.Level
	if _, ok := logLevels[level]; !ok {
		level = "info"
	}
	return sandboxLogEntry{Timestamp: l.Time, Level: level, Message: l.Message, Fields: fields}
}

// lineOf is entry e as a SandboxLog line: a JSON object of its fields
// with level, logger ("agent" unless the line names one) and message.
func lineOf(e sandboxLogEntry) sandboxLog {
	obj := map[string]string{"logger": "agent"}
	for k, v := range e.Fields {
		obj[k] = v
	}
	obj["level"], obj["message"] = e.Level, e.Message
	b, _ := json.Marshal(obj)
	return sandboxLog{Timestamp: e.Timestamp, Line: string(b)}
}

// logQueryInt reads an optional non-negative integer query parameter.
func logQueryInt(r *http.Request, name string) (int64, bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return 0, false, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, false, errdefs.InvalidField(name, "must be a non-negative integer")
	}
	return n, true, nil
}

// logLimit reads the limit parameter (1..maxLogLimit, default
// defaultLogLimit).
func logLimit(r *http.Request) (int, error) {
	n, set, err := logQueryInt(r, "limit")
	if err != nil || !set {
		return defaultLogLimit, err
	}
	if n < 1 || n > maxLogLimit {
		return 0, errdefs.InvalidField("limit", "must be between 1 and %d", maxLogLimit)
	}
	return int(n), nil
}

// handleLogs: GET /sandboxes/{id}/logs?start=&limit= (start in Unix ms)
// → 200 SandboxLogs: the sandbox's log lines from start on (what `e2b
// sandbox logs` prints), oldest first, both as JSON lines and as
// structured entries.
func (h *Handler) handleLogs(w http.ResponseWriter, r *http.Request) {
	start, _, err := logQueryInt(r, "start")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	limit, err := logLimit(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	lines, ok := h.logLines(w, r, time.UnixMilli(start), 0)
	if !ok {
		return
	}
	if len(lines) > limit {
		lines = lines[:limit]
	}
	out := struct {
		Logs       []sandboxLog      `json:"logs"`
		LogEntries []sandboxLogEntry `json:"logEntries"`
	}{Logs: []sandboxLog{}, LogEntries: []sandboxLogEntry{}}
	for _, l := range lines {
		e := entryOf(l)
		out.LogEntries = append(out.LogEntries, e)
		out.Logs = append(out.Logs, lineOf(e))
	}
	httpjson.Write(w, http.StatusOK, out)
}

// handleLogsV2: GET /v2/sandboxes/{id}/logs?cursor=&direction=&level=
// &limit=&search= → 200 SandboxLogsV2Response. cursor is Unix ms: lines
// at or after it going forward (the default), at or before it going
// backward (newest first); level is the least level kept; search a
// case-sensitive substring of the message.
func (h *Handler) handleLogsV2(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	cursor, hasCursor, err := logQueryInt(r, "cursor")
	if err != nil {
		h.fail(w, r, err)
		return
	}
	limit, err := logLimit(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	backward := false
	switch q.Get("direction") {
	case "", "forward":
	case "backward":
		backward = true
	default:
		h.fail(w, r, errdefs.InvalidField("direction", "must be forward or backward"))
		return
	}
	least := 0
	if v := q.Get("level"); v != "" {
		n, ok := logLevels[v]
		if !ok {
			h.fail(w, r, errdefs.InvalidField("level", "must be debug, info, warn or error"))
			return
		}
		least = n
	}
	since := time.Time{}
	if hasCursor && !backward {
		since = time.UnixMilli(cursor)
	}
	lines, ok := h.logLines(w, r, since, 0)
	if !ok {
		return
	}
	out := []sandboxLogEntry{}
	keep := func(l node.LogLine) bool {
		e := entryOf(l)
		if logLevels[e.Level] < least || !strings.Contains(e.Message, q.Get("search")) {
			return false
		}
		out = append(out, e)
		return len(out) < limit
	}
	if backward {
		for i := len(lines) - 1; i >= 0; i-- {
			if hasCursor && lines[i].Time.After(time.UnixMilli(cursor)) {
				continue
			}
			if !keep(lines[i]) {
				break
			}
		}
	} else {
		for _, l := range lines {
			if !keep(l) {
				break
			}
		}
	}
	httpjson.Write(w, http.StatusOK, struct {
		Logs []sandboxLogEntry `json:"logs"`
	}{out})
}

// logLines returns the lines of the path's sandbox from since on, or
// writes the error (404 for an unknown or ended sandbox) and returns
// false.
func (h *Handler) logLines(w http.ResponseWriter, r *http.Request, since time.Time, limit int) ([]node.LogLine, bool) {
	rec := h.session(w, r)
	if rec == nil {
		return nil, false
	}
	lines, err := h.mgr.Logs(r.Context(), rec.ID, since, limit)
	if err != nil {
		h.fail(w, r, err)
		return nil, false
	}
	// The runtime writes its own errors into the log too; host paths in
	// them are not the tenant's to see.
	for i := range lines {
		lines[i].Message = h.redact(lines[i].Message)
		for k, v := range lines[i].Fields {
			lines[i].Fields[k] = h.redact(v)
		}
	}
	return lines, true
}

// redact removes host paths from s (none when the handler has no
// redactor).
func (h *Handler) redact(s string) string {
	if h.hide == nil {
		return s
	}
	out, _ := h.hide.Redact(s)
	return out
}
