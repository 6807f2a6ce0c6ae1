// Package guest is the host's one client of a sandbox's agent: it alone
// speaks the envd protocol (the Connect-RPC process and filesystem
// services) and the agent's plain-HTTP endpoints (/files, /health, /stage,
// /init, /snapshot/prepare) over the agent's Unix socket, and turns what
// comes back into forkbox's domain values (package node) and error classes
// (package errdefs, through Classify).
//
// What needs the host (timeouts enforced by the runtime's kill, holds on a
// session, the in-flight budget, telling that a sandbox died) is the
// caller's: package sandbox orchestrates and calls a Client. The wire
// contract is ../proto/envd and the agent's own package.
package guest

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

// MaxMessage bounds one Connect message a Client accepts from an agent, in
// bytes. What an agent answers is shaped by the sandbox (a directory
// listing of a million files made in there), while the daemon's memory is
// the host's: without a bound one listing could take gigabytes. A bigger
// answer fails with resource_exhausted (ErrResourceExhausted).
const MaxMessage = 32 << 20

// BaseURL is the base URL of every agent request; the host part is
// ignored because the transport always dials the sandbox's Unix socket.
const BaseURL = "http://agent"

// Client is the host's connection to one sandbox's agent: an HTTP client
// whose transport dials the agent's Unix socket (HTTP/1.1 with keep-alive;
// one connection per concurrent call), and the envd clients on top of it.
// It is safe for concurrent use.
type Client struct {
	socket  string
	http    *http.Client
	process processpbconnect.ProcessClient
	fs      filesystempbconnect.FilesystemClient
}

// New returns a Client of the agent listening at socket (a host path, or a
// link the host made to one: see SocketFile). It connects lazily.
func New(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx, socket)
		},
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	hc := &http.Client{Transport: tr}
	return &Client{
		socket:  socket,
		http:    hc,
		process: processpbconnect.NewProcessClient(hc, BaseURL, connect.WithReadMaxBytes(MaxMessage)),
		fs:      filesystempbconnect.NewFilesystemClient(hc, BaseURL, connect.WithReadMaxBytes(MaxMessage)),
	}
}

// Socket returns the socket path the Client was made for.
func (c *Client) Socket() string { return c.socket }

// HTTPClient returns the HTTP client that reaches the agent (requests go
// to BaseURL), for proxying envd requests unchanged.
func (c *Client) HTTPClient() *http.Client { return c.http }

// Close drops the idle connections to the agent; the Client stays usable
// (a later call connects again).
func (c *Client) Close() { c.http.CloseIdleConnections() }

// dial connects to the agent's socket at path without following a link
// the sandbox controls. In the runc tier path is the daemon's own socket;
// a driver whose agent binds its socket itself (gVisor) makes path a
// symlink (which the host made) to a file in a directory the sandbox's
// root can write. Sandbox root could replace that file with a symlink to
// any socket on the host (another sandbox's agent): so the link the host
// made is read once, the file it names is opened with O_NOFOLLOW and must
// be a socket, and the connection goes through that descriptor.
//
// Errors are *DialError values, whose message names no host path (it
// reaches API clients); the path is in their Path for the log.
func dial(ctx context.Context, path string) (net.Conn, error) {
	file, err := SocketFile(path)
	if err != nil {
		return nil, &DialError{Path: path, Err: err}
	}
	fd, err := unix.Open(file, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &DialError{Path: file, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, &DialError{Path: file, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, &DialError{Path: file, Err: errNotSocket}
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", "/proc/self/fd/"+strconv.Itoa(fd))
	if err != nil {
		return nil, &DialError{Path: file, Err: err}
	}
	return conn, nil
}

// errNotSocket: what the agent's socket path names is not a socket.
var errNotSocket = errors.New("not a socket")

// DialError is a failure to connect to an agent's socket at Path (a host
// path, for logs). Its message says why without the path: the errno's
// text ("connection refused", "no such file or directory"), or that the
// dial was cancelled or timed out.
type DialError struct {
	Path string
	Err  error
}

// Error returns "connect to the sandbox's agent: <reason>".
func (e *DialError) Error() string {
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
func (e *DialError) Unwrap() error { return e.Err }

// SocketFile returns the file the agent's socket at path is: path itself,
// or the target of path when path is a symlink (which the host made; the
// target, which the sandbox may control, is not followed further). The
// error is Readlink's.
func SocketFile(path string) (string, error) {
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

// Health calls GET /health once: nil when the agent answers 2xx, else the
// transport's error (a *DialError when it could not connect) or the status.
func (c *Client) Health(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, BaseURL+"/health", nil)
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

// Listening reports (nil) whether something accepts connections on the
// agent's socket. The kernel completes a Unix stream connection into the
// listener's backlog, so this does not need the agent to be scheduled.
// Errors are *DialError values.
func (c *Client) Listening(ctx context.Context) error {
	conn, err := dial(ctx, c.socket)
	if err != nil {
		return err
	}
	return conn.Close()
}

// WaitReady polls Health (each attempt bounded at 2 s, 1 to 10 ms apart)
// until the agent answers or ctx ends; then the error wraps ctx's and
// names the last attempt's failure.
func (c *Client) WaitReady(ctx context.Context) error {
	delay := time.Millisecond
	for {
		attempt, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := c.Health(attempt)
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
