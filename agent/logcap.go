package agent

import (
	"io"
	"sync"
)

// maxLogBytes caps what the agent writes to its log (stderr, which the
// daemon points at DATA/sandboxes/ID/agent.log on the host). Code in the
// sandbox can make the agent log (root there can signal pid 1 in a loop, and
// each forwarded signal is a line), and that file lives outside the
// sandbox's writable layer and limits: without a cap a sandbox could fill
// the host's disk through it.
const maxLogBytes = 1 << 20

// logTruncatedNote is written once when the cap is reached.
const logTruncatedNote = "forkbox-agent: log limit reached; further messages are dropped\n"

// cappedWriter passes writes through to w until limit bytes have been
// written, then writes logTruncatedNote once and drops everything else.
// Each Write is passed whole or not at all, so log lines are never cut.
type cappedWriter struct {
	mu        sync.Mutex
	w         io.Writer
	left      int
	truncated bool
}

func newCappedWriter(w io.Writer, limit int) *cappedWriter {
	return &cappedWriter{w: w, left: limit}
}

// Write reports success for dropped data too, so callers never fail on it.
func (c *cappedWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(p) > c.left {
		if !c.truncated {
			c.truncated = true
			_, _ = io.WriteString(c.w, logTruncatedNote)
		}
		c.left = 0
		return len(p), nil
	}
	c.left -= len(p)
	return c.w.Write(p)
}
