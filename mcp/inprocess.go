package mcp

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
)

// InProcess returns an http.RoundTripper that serves each request with
// h in the calling process, as a server would: h runs in a goroutine of
// its own, the response is returned once h wrote its header (or
// returned), and its body streams what h writes as h writes it (server-
// sent events and JSON-line streams arrive line by line). Closing the
// response body, or ending the request's context, ends h's request
// context and makes its further writes fail, as a closed connection
// would. requestID, when not empty, is set as every request's
// X-Request-Id. A panic in h ends the response body with an error.
func InProcess(h http.Handler, requestID string) http.RoundTripper {
	return &inProcess{h: h, requestID: requestID}
}

type inProcess struct {
	h         http.Handler
	requestID string
}

// RoundTrip serves req with the handler.
func (t *inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	in := req.Clone(ctx)
	if in.Body == nil {
		in.Body = http.NoBody
	}
	in.RequestURI = req.URL.RequestURI()
	in.RemoteAddr = "127.0.0.1:0"
	if in.Host == "" {
		in.Host = req.URL.Host
	}
	if t.requestID != "" {
		in.Header.Set("X-Request-Id", t.requestID)
	}
	pr, pw := io.Pipe()
	w := &pipeResponse{header: http.Header{}, body: pw, started: make(chan struct{})}
	go func() {
		defer cancel()
		if req.Body != nil {
			defer req.Body.Close()
		}
		defer func() {
			if v := recover(); v != nil {
				w.start(http.StatusInternalServerError)
				pw.CloseWithError(fmt.Errorf("in-process handler panic: %v", v))
			}
		}()
		t.h.ServeHTTP(w, in)
		w.start(http.StatusOK)
		pw.Close()
	}()
	select {
	case <-w.started:
	case <-req.Context().Done():
		cancel()
		pr.Close()
		return nil, req.Context().Err()
	}
	return &http.Response{
		Status: fmt.Sprintf("%d %s", w.status, http.StatusText(w.status)), StatusCode: w.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.sent, Body: &cancelBody{r: pr, cancel: cancel}, ContentLength: -1, Request: req,
	}, nil
}

// cancelBody is a response body whose Close also ends the handler's
// request context.
type cancelBody struct {
	r      *io.PipeReader
	cancel context.CancelFunc
}

func (b *cancelBody) Read(p []byte) (int, error) { return b.r.Read(p) }

func (b *cancelBody) Close() error {
	b.cancel()
	return b.r.Close()
}

// pipeResponse is the http.ResponseWriter of an in-process request: the
// header is sent (a copy handed to the round trip) at the first write,
// WriteHeader or Flush, and the body goes into a pipe.
type pipeResponse struct {
	header  http.Header
	sent    http.Header
	status  int
	body    *io.PipeWriter
	once    sync.Once
	started chan struct{}
}

func (w *pipeResponse) Header() http.Header { return w.header }

// start sends the header with status, once.
func (w *pipeResponse) start(status int) {
	w.once.Do(func() {
		w.status, w.sent = status, w.header.Clone()
		close(w.started)
	})
}

// WriteHeader sends the header; informational statuses (1xx) are not
// passed on.
func (w *pipeResponse) WriteHeader(status int) {
	if status >= 200 {
		w.start(status)
	}
}

func (w *pipeResponse) Write(p []byte) (int, error) {
	w.start(http.StatusOK)
	return w.body.Write(p)
}

// Flush sends the header if it was not; written bytes need no flushing
// (the pipe hands them over as they are written).
func (w *pipeResponse) Flush() { w.start(http.StatusOK) }
