package agent

import (
	"errors"
	"net"
)

// retryListener makes every Accept error except a closed listener look
// temporary, so that http.Server retries (with its own backoff, up to a
// second) instead of returning. The agent is the sandbox's init: if Serve
// returned, the sandbox would die with it. And Accept can fail for reasons
// outside the sandbox: every sandbox's root is the same host uid, whose
// epoll watch limit (fs.epoll.max_user_watches) is shared, so a sandbox
// that exhausts it made the agents of all other sandboxes fail to register
// the next connection from the daemon (ENOSPC) and exit.
type retryListener struct{ net.Listener }

// Accept returns the next connection; errors other than net.ErrClosed are
// wrapped as temporary.
func (l retryListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return nil, temporaryError{err}
	}
	return c, err
}

// temporaryError is a net.Error that says it is temporary.
type temporaryError struct{ error }

func (temporaryError) Temporary() bool { return true }
func (temporaryError) Timeout() bool   { return false }
func (e temporaryError) Unwrap() error { return e.error }
