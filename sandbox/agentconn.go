package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/internal/envdpb/filesystempb/filesystempbconnect"
	"github.com/forkbox/forkbox/internal/envdpb/processpb/processpbconnect"
)

// maxAgentMessage bounds one Connect message the daemon accepts from an
// agent, in bytes. What an agent answers is shaped by the sandbox (a
// directory listing of a million files made in there), while the daemon's
// memory is the host's: without a bound one listing could take gigabytes.
// A bigger answer fails with resource_exhausted (ErrResourceExhausted).
const maxAgentMessage = 32 << 20

// agentBaseURL is the base URL of every agent request; the host part is
// ignored because the transport always dials the sandbox's Unix socket.
const agentBaseURL = "http://agent"

// agentConn is the daemon's connection to one sandbox's agent: an HTTP
// client whose transport dials the agent's Unix socket (HTTP/1.1 with
// keep-alive; one connection per concurrent call), and the envd clients on
// top of it.
type agentConn struct {
	socket  string
	http    *http.Client
	process processpbconnect.ProcessClient
	fs      filesystempbconnect.FilesystemClient
}

func newAgentConn(socket string) *agentConn {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialAgent(ctx, socket)
		},
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	hc := &http.Client{Transport: tr}
	return &agentConn{
		socket:  socket,
		http:    hc,
		process: processpbconnect.NewProcessClient(hc, agentBaseURL, connect.WithReadMaxBytes(maxAgentMessage)),
		fs:      filesystempbconnect.NewFilesystemClient(hc, agentBaseURL, connect.WithReadMaxBytes(maxAgentMessage)),
	}
}

// dialAgent connects to the agent's socket at path without following a
// link the sandbox controls. In the runc tier path is the daemon's own
// socket; a driver whose agent binds its socket itself (gVisor) makes path
// a symlink (which the host made) to a file in a directory the sandbox's
// root can write. Sandbox root could replace that file with a symlink to
// any socket on the host (another sandbox's agent): so the link the host
// made is read once, the file it names is opened with O_NOFOLLOW and must
// be a socket, and the connection goes through that descriptor.
//
// Errors are *dialError values, whose message names no host path (it
// reaches API clients); the path is in their Path for the log.
func dialAgent(ctx context.Context, path string) (net.Conn, error) {
	file, err := agentSocketFile(path)
	if err != nil {
		return nil, &dialError{Path: path, Err: err}
	}
	fd, err := unix.Open(file, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &dialError{Path: file, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &dialError{Path: file, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, &dialError{Path: file, Err: errNotSocket}
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		return nil, &dialError{Path: file, Err: err}
	}
	return conn, nil
}

// errNotSocket: what the agent's socket path names is not a socket.
var errNotSocket = errors.New("not a socket")

// dialError is a failure to connect to an agent's socket at Path (a host
// path, for logs). Its message says why without the path: the errno's
// text ("connection refused", "no such file or directory"), or that the
// dial was cancelled or timed out.
type dialError struct {
	Path string
	Err  error
}

// Error returns "connect to the sandbox's agent: <reason>".
func (e *dialError) Error() string {
	reason := "failed"
	var errno unix.Errno
	switch {
	case errors.Is(e.Err, errNotSocket):
		reason = "its socket is not a socket"
	case errors.Is(e.Err, context.Canceled):
		reason = "cancelled"
	case errors.Is(e.Err, context.DeadlineExceeded):
		reason = "timed out"
	case errors.As(e.Err, &errno):
		reason = errno.Error()
	}
	return "connect to the sandbox's agent: " + reason
}

// Unwrap returns the underlying error (with the path).
func (e *dialError) Unwrap() error { return e.Err }

// agentSocketFile returns the file the agent's socket is at: path itself,
// or the target of path when path is a symlink (which the host made; the
// target, which the sandbox may control, is not followed further).
func agentSocketFile(path string) (string, error) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&os.ModeSymlink == 0 {
		return path, nil
	}
	target, err := os.Readlink(path)
	if err != nil {
		return "", err
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(filepath.Dir(path), target)
	}
	return target, nil
}

// health calls GET /health once; nil when the agent answers 2xx.
func (c *agentConn) health(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, agentBaseURL+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("agent health: HTTP %d", resp.StatusCode)
	}
	return nil
}

// listening reports (nil) whether something accepts connections on the
// agent's socket. The kernel completes a Unix stream connection into the
// listener's backlog, so this does not need the agent to be scheduled.
func (c *agentConn) listening(ctx context.Context) error {
	conn, err := dialAgent(ctx, c.socket)
	if err != nil {
		return err
	}
	return conn.Close()
}

// waitReady polls health until the agent answers or ctx ends.
func (c *agentConn) waitReady(ctx context.Context) error {
	delay := time.Millisecond
	for {
		attempt, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := c.health(attempt)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("agent not ready: %w (last error: %v)", ctx.Err(), err)
		case <-time.After(delay):
		}
		delay = min(delay*2, 10*time.Millisecond)
	}
}

func (c *agentConn) close() {
	c.http.CloseIdleConnections()
}
