package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/guest/wire"
)

// flakyListener fails its first n Accept calls with ENOSPC, as accept does
// when the process's host uid has no epoll watches left.
type flakyListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "unix", Err: syscall.ENOSPC}
	}
	return l.Listener.Accept()
}

// TestServeSurvivesAcceptErrors: the agent keeps serving after Accept
// errors that are not its fault instead of returning (and, being init,
// taking the sandbox down).
func TestServeSurvivesAcceptErrors(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ul, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	fl := &flakyListener{Listener: ul}
	fl.fails.Store(3)
	a := New(wire.Config{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() {
		srv := &http.Server{Handler: a.Handler()}
		go func() { <-ctx.Done(); srv.Close() }()
		served <- srv.Serve(retryListener{fl})
	}()
	defer func() {
		cancel()
		if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	}()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		},
	}}
	resp, err := c.Get("http://agent/health")
	if err != nil {
		select {
		case serr := <-served:
			served <- serr
			t.Fatalf("Serve returned after accept errors: %v (request: %v)", serr, err)
		default:
		}
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("health = %d", resp.StatusCode)
	}
}
