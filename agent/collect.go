package agent

import (
	"errors"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/internal/envdpb/processpb"
)

// Collected output: a stream that asks for it (wire.CollectHeader) gets a
// process's output whole after the process ended instead of as it comes.
// The daemon answers such an exec with one JSON result; holding the output
// here, in memfds whose pages count against the sandbox's memory limit,
// keeps it out of the daemon's memory, which every tenant shares.

// collection is one stream's collected output. Safe for concurrent use.
type collection struct {
	limit  int64
	mu     sync.Mutex
	parts  [2]collected // stdout (and PTY output), stderr
	closed bool         // the stream is gone: keep nothing more
}

type collected struct {
	f         *os.File // nil until the first byte
	n         int64
	checked   int64 // n when the sandbox's free memory was last checked
	truncated bool
	err       error
}

// parseCollect reads wire.CollectHeader: nil when it is absent or not a
// positive number.
func parseCollect(h interface{ Get(string) string }) *collection {
	n, err := strconv.ParseInt(h.Get(wire.CollectHeader), 10, 64)
	if err != nil || n <= 0 {
		return nil
	}
	return &collection{limit: n}
}

// add keeps a data event's bytes, up to the limit.
func (c *collection) add(d *processpb.ProcessEvent_DataEvent) {
	i, p := 0, d.GetStdout()
	switch o := d.GetOutput().(type) {
	case *processpb.ProcessEvent_DataEvent_Stderr:
		i, p = 1, o.Stderr
	case *processpb.ProcessEvent_DataEvent_Pty:
		p = o.Pty
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	part := &c.parts[i]
	if c.closed || part.truncated || part.err != nil || len(p) == 0 {
		return
	}
	if room := c.limit - part.n; int64(len(p)) > room {
		p, part.truncated = p[:room], true
	}
	if part.n+int64(len(p))-part.checked > checkStep {
		if checkMemoryRoom(checkStep) != nil {
			part.truncated = true
			return
		}
		part.checked = part.n
	}
	if part.f == nil {
		if part.f, part.err = newMemfd("forkbox-output"); part.err != nil {
			return
		}
	}
	if _, err := part.f.Write(p); err != nil {
		part.err, part.truncated = err, true
		return
	}
	part.n += int64(len(p))
}

// send sends the collected output as data events of at most outputChunk
// bytes, stdout first.
func (c *collection) send(send func(*processpb.ProcessEvent) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	buf := make([]byte, outputChunk)
	for i := range c.parts {
		f := c.parts[i].f
		if f == nil {
			continue
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return err
		}
		for {
			n, err := f.Read(buf)
			if n > 0 {
				chunk := append([]byte(nil), buf[:n]...)
				d := &processpb.ProcessEvent_DataEvent{Output: &processpb.ProcessEvent_DataEvent_Stdout{Stdout: chunk}}
				if i == 1 {
					d = &processpb.ProcessEvent_DataEvent{Output: &processpb.ProcessEvent_DataEvent_Stderr{Stderr: chunk}}
				}
				if err := send(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Data{Data: d}}); err != nil {
					return err
				}
			}
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// truncated returns wire.TruncatedTrailer's value ("" when nothing was cut).
func (c *collection) truncated() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var names []string
	for i, name := range []string{"stdout", "stderr"} {
		if c.parts[i].truncated {
			names = append(names, name)
		}
	}
	return strings.Join(names, ",")
}

// close frees the memfds.
func (c *collection) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for i := range c.parts {
		if c.parts[i].f != nil {
			_ = c.parts[i].f.Close()
			c.parts[i].f = nil
		}
	}
}
