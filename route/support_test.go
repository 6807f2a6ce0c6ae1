package route

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
)

// TestHostCacheSlowRegistry: while a registry read hangs (a quorum
// lost), another caller is not held behind it past its own context,
// a list read less than 10 s before answers at once, and the callers
// that waited share the one read's result instead of reading again.
func TestHostCacheSlowRegistry(t *testing.T) {
	entered, release := make(chan struct{}, 8), make(chan struct{})
	var calls atomic.Int32
	fail := false
	c := &hostCache{list: func(ctx context.Context) ([]fleet.Host, error) {
		calls.Add(1)
		entered <- struct{}{}
		<-release
		if fail {
			return nil, errdefs.Newf(errdefs.ErrUnavailable, "no quorum")
		}
		return []fleet.Host{{ID: "a"}}, nil
	}}
	fail = true
	done := make(chan error, 1)
	go func() { _, err := c.get(context.Background()); done <- err }()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	got := make(chan error, 1)
	go func() { _, err := c.get(ctx); got <- err }()
	select {
	case err := <-got:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a caller behind a hanging read: %v, want its own deadline", err)
		}
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("a caller with a 100 ms deadline is still held behind a hanging registry read after 5 s")
	}
	waiter := make(chan error, 1)
	go func() { _, err := c.get(context.Background()); waiter <- err }()
	time.Sleep(50 * time.Millisecond)
	close(release)
	if err := <-done; !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("the reader: %v, want the registry's error", err)
	}
	if err := <-waiter; !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a waiter: %v, want the read's error", err)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d registry reads for callers that arrived during one, want 1", n)
	}

	// A list read less than 10 s ago answers while a read hangs.
	release = make(chan struct{})
	fail = false
	close(release)
	if hs, err := c.get(context.Background()); err != nil || len(hs) != 1 {
		t.Fatalf("a read that works: %v %v", hs, err)
	}
	<-entered
	c.mu.Lock()
	c.at = time.Now().Add(-2 * time.Second) // past a second: read again
	c.mu.Unlock()
	release = make(chan struct{})
	go func() { _, err := c.get(context.Background()); done <- err }()
	<-entered
	ctx2, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	if hs, err := c.get(ctx2); err != nil || len(hs) != 1 || hs[0].ID != "a" {
		t.Errorf("while a read hangs, a list 2 s old: %v %v, want it", hs, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestRouterNoQuorum: while the directory cannot be read, a request
// for a session this host does not hold is 503 with a Retry-After (on
// E2B's wire too), not the local API's 404 telling the client it is
// gone; what this host holds, and what the local API answers otherwise,
// are served as they are.
func TestRouterNoQuorum(t *testing.T) {
	local := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/ended") {
			w.WriteHeader(http.StatusGone)
			return
		}
		if !strings.HasSuffix(r.URL.Path, "/here") {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"status":404}`))
			return
		}
		_, _ = w.Write([]byte(`{"served":"here"}`))
	})
	hosts := func(ctx context.Context) ([]fleet.Host, error) { return []fleet.Host{{ID: "b"}}, nil }
	rt := New(Options{Self: "b", Local: local, Key: DeriveKey("a-fleet-secret-of-at-least-32-bytes-long"), Hosts: hosts,
		Directory: func() (*fleet.Directory, error) { return nil, errdefs.Newf(errdefs.ErrUnavailable, "no quorum") },
		Holds:     func(ctx context.Context, kind fleet.Kind, id string) bool { return id == "here" },
		Log:       slog.New(slog.NewTextHandler(io.Discard, nil))})
	for _, c := range []struct {
		path string
		want int
	}{
		{"/v1/sessions/elsewhere", http.StatusServiceUnavailable},
		{"/sandboxes/elsewhere", http.StatusServiceUnavailable},
		{"/v1/sessions/here", http.StatusOK},
		{"/v1/sessions/ended", http.StatusGone},
	} {
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, httptest.NewRequest("GET", c.path, nil))
		if w.Code != c.want {
			t.Errorf("%s without a directory: %d %s, want %d", c.path, w.Code, w.Body, c.want)
			continue
		}
		if c.want == http.StatusServiceUnavailable && (w.Header().Get("Retry-After") == "" || strings.Contains(w.Body.String(), `"status":404`)) {
			t.Errorf("%s: Retry-After %q, body %s", c.path, w.Header().Get("Retry-After"), w.Body)
		}
	}
}
