package guest

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest/wire"
)

// TestUnreachable: a socket that is missing, not a socket, or a link the
// sandbox could have planted fails to dial with a message that names no
// host path, and classifies as Unreachable with the dial in Cause.
func TestUnreachable(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "plain")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// A link the host made to a link (which the sandbox may control) to a
	// real socket: the second link is not followed (it is opened itself,
	// and is no socket).
	sock := filepath.Join(dir, "real.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	planted := filepath.Join(dir, "planted")
	hostLink := filepath.Join(dir, "host-link")
	if err := os.Symlink(sock, planted); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(planted, hostLink); err != nil {
		t.Fatal(err)
	}
	ctx := guard(t)
	for _, c := range []struct {
		path, reason string
	}{
		{filepath.Join(dir, "missing.sock"), "no such file or directory"},
		{file, "its socket is not a socket"},
		{hostLink, "its socket is not a socket"},
	} {
		cl := New(c.path)
		err := cl.Listening(ctx)
		var de *DialError
		if !errors.As(err, &de) || !strings.HasSuffix(err.Error(), c.reason) || strings.Contains(err.Error(), dir) {
			t.Errorf("%s: %v, want a dial error %q without the path", c.path, err, c.reason)
		}
		_, err = cl.Stat(ctx, "/", "root")
		ce := Classify(ctx, err, "path")
		var ge *Error
		if !errors.As(ce, &ge) || ge.Kind != Unreachable || !errors.Is(ce, errdefs.ErrUnavailable) ||
			!errors.As(ge.Cause, &de) || strings.Contains(ce.Error(), dir) {
			t.Errorf("%s: stat classified as %v", c.path, ce)
		}
		if errors.As(ce, &de) {
			t.Errorf("%s: the dial (with its host path) is in the classified chain", c.path)
		}
		cl.Close()
	}
	// A link the host made straight to the socket is followed.
	direct := filepath.Join(dir, "direct")
	if err := os.Symlink(sock, direct); err != nil {
		t.Fatal(err)
	}
	if got, err := SocketFile(direct); err != nil || got != sock {
		t.Fatalf("socket file of a link: %q %v", got, err)
	}
	if err := New(direct).Listening(ctx); err != nil {
		t.Fatalf("dial through the host's link: %v", err)
	}
	// Classify leaves the caller's own cancellation alone.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = New(sock).Stat(cctx, "/", "root")
	if got := Classify(cctx, err, ""); !errors.Is(got, context.Canceled) || errors.Is(got, errdefs.ErrUnavailable) {
		t.Fatalf("cancelled call classified as %v", got)
	}
}

// TestWaitReady: the wait ends with the caller's deadline when nothing
// answers, and as soon as an agent does.
func TestWaitReady(t *testing.T) {
	c := New(filepath.Join(t.TempDir(), "none.sock"))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.WaitReady(ctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "last error") {
		t.Fatalf("wait for no agent: %v", err)
	}
	_, c = startAgent(t) // (startAgent waits with WaitReady)
	if err := c.Health(guard(t)); err != nil {
		t.Fatal(err)
	}
}

// TestPrepareCheckpoint: a prepared agent stops listening (its socket is
// unlinked) and serves again after the host's resume file.
func TestPrepareCheckpoint(t *testing.T) {
	a, c := startAgent(t)
	ctx := guard(t)
	if err := c.PrepareCheckpoint(ctx, 7); err != nil {
		t.Fatal(err)
	}
	c.Close()
	for {
		if _, err := os.Lstat(a.socket); errors.Is(err, os.ErrNotExist) {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the prepared agent still listens")
		}
		time.Sleep(time.Millisecond)
	}
	if err := c.Health(ctx); err == nil {
		t.Fatal("a prepared agent answered")
	}
	b, _ := json.Marshal(wire.ResumeFile{Generation: 7})
	if err := os.WriteFile(a.control, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(ctx); err != nil {
		t.Fatalf("after the resume file: %v", err)
	}
	// A prepare the agent refuses (generation 0) is ErrUnavailable.
	if err := c.PrepareCheckpoint(ctx, 0); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("prepare generation 0: %v", err)
	}
}
