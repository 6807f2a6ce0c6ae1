package codecall

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

func TestAgentPath(t *testing.T) {
	for _, tc := range []struct {
		method, path, want string
		ok                 bool
	}{
		{"POST", "/execute", "/code/execute", true},
		{"GET", "/execute", "/code/execute", false},
		{"GET", "/health", "/code/health", true},
		{"GET", "/contexts", "/code/contexts", true},
		{"POST", "/contexts", "/code/contexts", true},
		{"DELETE", "/contexts/abc-1", "/code/contexts/abc-1", true},
		{"POST", "/contexts/abc-1/restart", "/code/contexts/abc-1/restart", true},
		{"DELETE", "/contexts/a/b", "/code/contexts/a/b", false},
		{"DELETE", "/contexts/..", "/code/contexts/..", false},
		{"POST", "/contexts/../restart", "/code/contexts/../restart", false},
		{"DELETE", "/contexts/", "/code/contexts/", false},
		{"GET", "/files", "", false},
		{"POST", "/init", "", false},
	} {
		got, ok := AgentPath(tc.method, tc.path)
		if ok != tc.ok || (ok && got != tc.want) {
			t.Errorf("AgentPath(%s %s) = %q, %v; want %q, %v", tc.method, tc.path, got, ok, tc.want, tc.ok)
		}
	}
}

func TestCellHash(t *testing.T) {
	a, err := CellHash([]byte(`{"code":"print(1)","language":"python"}`))
	if err != nil || len(a) != 64 {
		t.Fatalf("CellHash = %q, %v", a, err)
	}
	b, _ := CellHash([]byte(`{"code":"print(2)"}`))
	if a == b {
		t.Fatal("two cells hash the same")
	}
	var fe *errdefs.FieldError
	if _, err := CellHash([]byte(`{"language":"python"}`)); !errors.As(err, &fe) || fe.Field != "code" {
		t.Fatalf("no code: %v, want a field error naming code", err)
	}
	if _, err := CellHash([]byte(`[1]`)); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("not an object: %v", err)
	}
}

func TestReadBodyBound(t *testing.T) {
	if _, err := ReadBody(strings.NewReader(strings.Repeat("x", MaxRequestBody+1))); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("oversized body: %v", err)
	}
	if b, err := ReadBody(strings.NewReader(`{"code":"1"}`)); err != nil || string(b) != `{"code":"1"}` {
		t.Fatalf("ReadBody = %q, %v", b, err)
	}
}

func TestErrorOf(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		class  error
		msg    string
	}{
		{404, `{"message":"Context x not found"}`, errdefs.ErrNotFound, "Context x not found"},
		{400, "Unsupported language: cobol", errdefs.ErrInvalidArgument, "Unsupported language: cobol"},
		{422, `{"detail":"bad field"}`, errdefs.ErrInvalidArgument, "bad field"},
		{500, `{"error":"kernel died"}`, errdefs.ErrUnavailable, "kernel died"},
	} {
		err := ErrorOf(&http.Response{StatusCode: tc.status, Body: io.NopCloser(strings.NewReader(tc.body))})
		if !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("ErrorOf(%d %s) = %v; want class %v with %q", tc.status, tc.body, err, tc.class, tc.msg)
		}
	}
}

// TestDoStreamsAndCancels runs a call over a real Unix socket, as the
// agent is reached: lines arrive before the answer ends, and cancelling
// the call's context ends the agent side's request.
func TestDoStreamsAndCancels(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	gone := make(chan struct{})
	release := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/code/execute" || r.Header.Get("Content-Type") != "application/json" {
			http.Error(w, "unexpected "+r.URL.Path, 400)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"type":"stdout","text":"1\n"}`+"\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			close(gone)
		case <-release:
		}
	})}
	go srv.Serve(ln)
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	conn := node.NewEnvdConn(client, "http://agent", nil)

	ctx, cancel := context.WithCancel(context.Background())
	resp, err := Do(ctx, conn, "POST", "/code/execute", []byte(`{"code":"print(1)"}`))
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	first := make([]byte, 64)
	n, err := resp.Body.Read(first)
	if err != nil || !strings.Contains(string(first[:n]), `"stdout"`) {
		t.Fatalf("first line before the end: %q, %v", first[:n], err)
	}
	cancel()
	select {
	case <-gone:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("cancelling the call did not end the agent's request")
	}
	if err := Copy(rec, resp.Body); err == nil {
		t.Fatal("copy of a cancelled call reported no error")
	}
	resp.Body.Close()
}

func TestCopyFlushes(t *testing.T) {
	rec := httptest.NewRecorder()
	if err := Copy(rec, strings.NewReader("a\nb\n")); err != nil {
		t.Fatal(err)
	}
	if rec.Body.String() != "a\nb\n" || !rec.Flushed {
		t.Fatalf("Copy wrote %q, flushed %v", rec.Body.String(), rec.Flushed)
	}
}
