package interp

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/internal/httpjson"
)

// keepaliveAfter is the silence after which an /execute stream gets a
// keepalive line (E2B's protocol: 5 s).
const keepaliveAfter = 5 * time.Second

// maxBody bounds a request body, in bytes.
const maxBody = 2 << 20

// Handler returns the service's HTTP API, E2B's port-49999 protocol
// (@e2b/code-interpreter 2.8.0) under prefix (for example "/code"):
//
//	POST   /execute               {"code", "context_id"?, "language"?, "env_vars"?} → 200, JSON lines
//	POST   /contexts              {"language"?, "cwd"?} → {"id","language","cwd"}
//	GET    /contexts              → [{"id","language","cwd"}, ...]
//	DELETE /contexts/{id}         → 204 (404 "Context <id> not found")
//	POST   /contexts/{id}/restart → 204
//	GET    /health                → 200
//
// Errors are plain text, as the reference server's: 400 for bad input
// (naming the field), 404 for an unknown context, 429 at MaxContexts, 500
// when an interpreter cannot start.
func (s *Service) Handler(prefix string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+prefix+"/execute", s.handleExecute)
	mux.HandleFunc("POST "+prefix+"/contexts", s.handleCreate)
	mux.HandleFunc("GET "+prefix+"/contexts", func(w http.ResponseWriter, r *http.Request) {
		httpjson.Write(w, http.StatusOK, s.List())
	})
	mux.HandleFunc("DELETE "+prefix+"/contexts/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := s.Delete(r.PathValue("id")); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST "+prefix+"/contexts/{id}/restart", func(w http.ResponseWriter, r *http.Request) {
		if err := s.Restart(r.PathValue("id")); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET "+prefix+"/health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("OK"))
	})
	return mux
}

// executeRequest is the body of POST /execute.
type executeRequest struct {
	Code      *string           `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

func (s *Service) handleExecute(w http.ResponseWriter, r *http.Request) {
	var req executeRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	switch {
	case req.Code == nil:
		writeError(w, fmt.Errorf("%w: code is required", errInvalid))
		return
	case req.ContextID != "" && req.Language != "":
		writeError(w, fmt.Errorf("%w: context_id and language cannot both be set (a context has its language)", errInvalid))
		return
	}
	for k, v := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			writeError(w, fmt.Errorf("%w: env_vars name %q is not a valid environment variable (or its value has a NUL byte)", errInvalid, k))
			return
		}
	}
	c, err := s.lookup(req.ContextID, req.Language)
	if err != nil {
		writeError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	lw := newLineWriter(w)
	// The headers go now: a cell may wait for its turn behind another,
	// and clients bound the time to the headers (the SDK: 60 s).
	_ = lw.rc.Flush()
	stop := lw.keepalive()
	err = s.execute(r.Context(), c, *req.Code, req.EnvVars, lw.write)
	stop()
	if err != nil {
		lw.write(errorLine("ContextError", err.Error(), ""))
	}
	lw.write([]byte(`{"type":"end_of_execution"}`))
}

// createRequest is the body of POST /contexts.
type createRequest struct {
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (s *Service) handleCreate(w http.ResponseWriter, r *http.Request) {
	var req createRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	c, err := s.Create(req.Language, req.Cwd)
	if err != nil {
		writeError(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, c)
}

// decode reads r's JSON body (at most maxBody bytes; an empty body is an
// empty object) into v.
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, maxBody))
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: the body is not a JSON object of this call: %v", errInvalid, err)
	}
	return nil
}

// writeError writes err as plain text with the status of its class.
func writeError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	switch {
	case errors.Is(err, errNotFound):
		status = http.StatusNotFound
	case errors.Is(err, errInvalid):
		status = http.StatusBadRequest
	case errors.Is(err, errTooMany):
		status = http.StatusTooManyRequests
	case errors.Is(err, errClosed):
		status = http.StatusServiceUnavailable
	}
	msg := err.Error()
	for _, e := range []error{errNotFound, errInvalid, errTooMany, errClosed} {
		msg = strings.TrimPrefix(msg, e.Error()+": ")
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg))
}

// lineWriter writes an /execute stream's lines, flushing each, from the
// cell and the keepalive timer.
type lineWriter struct {
	mu   sync.Mutex
	w    http.ResponseWriter
	rc   *http.ResponseController
	last time.Time
	dead bool // a write failed: the client is gone
}

func newLineWriter(w http.ResponseWriter) *lineWriter {
	return &lineWriter{w: w, rc: http.NewResponseController(w), last: time.Now()}
}

// write writes line and a newline and flushes. After a failed write it
// drops lines (the request's context ends too, which interrupts the cell).
func (lw *lineWriter) write(line []byte) {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	if lw.dead {
		return
	}
	if _, err := lw.w.Write(append(line, '\n')); err != nil {
		lw.dead = true
		return
	}
	if err := lw.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		lw.dead = true
	}
	lw.last = time.Now()
}

// keepalive writes a keepalive line whenever the stream has been silent
// for keepaliveAfter, until the returned stop is called.
func (lw *lineWriter) keepalive() (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				lw.mu.Lock()
				quiet := time.Since(lw.last) >= keepaliveAfter
				lw.mu.Unlock()
				if quiet {
					lw.write([]byte(`{"type":"keepalive"}`))
				}
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}
