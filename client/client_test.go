package client

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// TestMissingIDRefusedLocally proves every call that names a resource by
// id or name refuses an empty one (and "." or "..") with "... is
// required" / "is not ..." before sending anything: the daemon would
// answer such a path with "the URL path is not clean".
func TestMissingIDRefusedLocally(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("a request was sent: %s %s", r.Method, r.URL.Path)
		w.WriteHeader(http.StatusTeapot)
	}))
	defer srv.Close()
	c := New(srv.URL, "key", nil)
	ctx := context.Background()
	calls := map[string]func(id string) error{
		"Exec": func(id string) error {
			_, err := c.Exec(ctx, id, ExecRequest{Cmd: "true"}, io.Discard, io.Discard)
			return err
		},
		"ExecCollect":    func(id string) error { _, err := c.ExecCollect(ctx, id, ExecRequest{Cmd: "true"}); return err },
		"ExecBackground": func(id string) error { _, err := c.ExecBackground(ctx, id, ExecRequest{Cmd: "true"}); return err },
		"Processes":      func(id string) error { _, err := c.Processes(ctx, id); return err },
		"Attach":         func(id string) error { _, err := c.Attach(ctx, id, 7, io.Discard, io.Discard); return err },
		"Kill":           func(id string) error { return c.Kill(ctx, id, 7) },
		"Signal":         func(id string) error { return c.Signal(ctx, id, 7, 15) },
		"SendStdin":      func(id string) error { return c.SendStdin(ctx, id, 7, nil, true) },
		"Upload":         func(id string) error { _, err := c.Upload(ctx, id, "/tmp/x", bytes.NewReader(nil), 0, ""); return err },
		"Download":       func(id string) error { _, err := c.Download(ctx, id, "/tmp/x", ""); return err },
		"UploadFile":     func(id string) error { _, err := c.UploadFile(ctx, id, "/tmp/x", "client_test.go", ""); return err },
		"DownloadFile":   func(id string) error { return c.DownloadFile(ctx, id, "/tmp/x", t.TempDir()+"/x", "") },
		"ImportTemplatePath": func(id string) error {
			_, err := c.ImportTemplatePath(ctx, id, "", t.TempDir())
			return err
		},
		"Remove":         func(id string) error { return c.Remove(ctx, id, "/tmp/x", "") },
		"Stat":           func(id string) error { _, err := c.Stat(ctx, id, "/tmp/x", ""); return err },
		"ListDir":        func(id string) error { _, err := c.ListDir(ctx, id, "/tmp", 1, ""); return err },
		"MakeDir":        func(id string) error { _, err := c.MakeDir(ctx, id, "/tmp/x", ""); return err },
		"Move":           func(id string) error { _, err := c.Move(ctx, id, "/tmp/x", "/tmp/y", ""); return err },
		"GetSession":     func(id string) error { _, err := c.GetSession(ctx, id); return err },
		"DeleteSession":  func(id string) error { return c.DeleteSession(ctx, id) },
		"SetTimeout":     func(id string) error { _, err := c.SetTimeout(ctx, id, 60); return err },
		"Usage":          func(id string) error { _, err := c.Usage(ctx, id); return err },
		"Egress":         func(id string) error { _, err := c.Egress(ctx, id, 0, 10); return err },
		"Snapshot":       func(id string) error { _, err := c.Snapshot(ctx, id, 0); return err },
		"SnapshotWith":   func(id string) error { _, err := c.SnapshotWith(ctx, id, SnapshotRequest{}); return err },
		"ForkSession":    func(id string) error { _, err := c.ForkSession(ctx, id, ForkRequest{Count: 1}); return err },
		"Pause":          func(id string) error { _, err := c.Pause(ctx, id); return err },
		"Resume":         func(id string) error { _, err := c.Resume(ctx, id); return err },
		"ForkSnapshot":   func(id string) error { _, err := c.ForkSnapshot(ctx, id, ForkRequest{Count: 1}); return err },
		"GetSnapshot":    func(id string) error { _, err := c.GetSnapshot(ctx, id); return err },
		"DeleteSnapshot": func(id string) error { return c.DeleteSnapshot(ctx, id, false) },
		"ImportTemplate": func(id string) error {
			_, err := c.ImportTemplate(ctx, id, "", bytes.NewReader(nil), 0)
			return err
		},
		"DeleteTemplate": func(id string) error { return c.DeleteTemplate(ctx, id) },
		"SetPool":        func(id string) error { _, err := c.SetPool(ctx, Pool{Template: id, Size: 1}); return err },
		"CreateTenant":   func(id string) error { _, err := c.CreateTenant(ctx, id, TenantPolicy{}); return err },
		"GetTenant":      func(id string) error { _, err := c.GetTenant(ctx, id); return err },
		"UpdateTenant":   func(id string) error { _, err := c.UpdateTenant(ctx, id, TenantPolicy{}, false); return err },
		"DeleteTenant":   func(id string) error { return c.DeleteTenant(ctx, id, false) },
		"CreateKey":      func(id string) error { _, err := c.CreateKey(ctx, id, "ci", false); return err },
		"RevokeKey":      func(id string) error { return c.RevokeKey(ctx, id) },
	}
	for name, call := range calls {
		for id, want := range map[string]string{"": " is required", "..": "is not a", ".": "is not a"} {
			err := call(id)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
				t.Errorf("%s(%q): %v, want an invalid argument saying %q", name, id, err, want)
			}
		}
	}
	if err := c.DeleteSession(ctx, ""); err == nil || !strings.Contains(err.Error(), "a session id is required") {
		t.Errorf("DeleteSession(\"\"): %v", err)
	}
}

// TestConnectionsKeptAlive proves a Client made without an HTTP client
// keeps its connections to the daemon alive: 8 callers at once making 20
// calls each open at most 16 connections (Go's default transport keeps 2
// idle, so the others would be opened and closed per call), also when a
// JSON answer is chunked and ends after the document (its trailing
// newline comes in a write of its own). (A connection goes back to the
// pool a moment after its answer was read, so a few more than 8 may open.)
func TestConnectionsKeptAlive(t *testing.T) {
	var opened atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(2 * time.Millisecond) // so that the 8 callers' calls overlap
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, `{"pid":7}`)
		w.(http.Flusher).Flush() // chunked from here on
		time.Sleep(time.Millisecond)
		io.WriteString(w, "\n") // after the client decoded the document
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			opened.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := New(srv.URL, "key", nil)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if pid, err := c.ExecBackground(context.Background(), "s1", ExecRequest{Cmd: "sleep 1"}); err != nil || pid != 7 {
					t.Errorf("ExecBackground: %d, %v", pid, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// A connection goes back to the pool a moment after its answer was
	// read, so a caller's next call may open another: hence 2 x 8.
	if n := opened.Load(); n > 16 {
		t.Fatalf("160 calls by 8 callers opened %d connections, want at most 16", n)
	}
}
