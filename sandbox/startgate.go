package sandbox

import (
	"context"
	"sync"
	"time"
)

// startHoldMax bounds how long a pause waits for the command starts in
// flight: a start the agent never answers (a hostile sandbox can stop
// its own agent) holds a pause up no longer than this.
const startHoldMax = 5 * time.Second

// startGate keeps a pause from freezing a sandbox between the agent
// starting a command and reporting its pid. Frozen there, the exec would
// wait for a pid that comes only after a resume, so its timeout could not
// be enforced (the host kills by pid) and its stream ended in a deadline
// error. Starts pass side by side; a pause holds the gate, which keeps new
// starts out and waits (up to startHoldMax) for those in flight. The zero
// value is open. Safe for concurrent use; one holder at a time (pauses are
// serialised by the sandbox's lifeMu).
type startGate struct {
	mu      sync.Mutex
	n       int           // starts in flight
	held    chan struct{} // non-nil while held; closed when let go
	drained chan struct{} // non-nil while the holder waits; closed when n reaches 0
}

// enter waits while the gate is held, then counts one start in flight
// (end it with leave). It returns ctx's error when ctx ends first.
func (g *startGate) enter(ctx context.Context) error {
	g.mu.Lock()
	for g.held != nil {
		h := g.held
		g.mu.Unlock()
		select {
		case <-h:
		case <-ctx.Done():
			return ctx.Err()
		}
		g.mu.Lock()
	}
	g.n++
	g.mu.Unlock()
	return nil
}

// leave ends one start counted by enter.
func (g *startGate) leave() {
	g.mu.Lock()
	g.n--
	if g.n == 0 && g.drained != nil {
		close(g.drained)
		g.drained = nil
	}
	g.mu.Unlock()
}

// hold keeps new starts out until the returned function is called, and
// first waits up to d for the starts in flight to end.
func (g *startGate) hold(d time.Duration) (release func()) {
	g.mu.Lock()
	h := make(chan struct{})
	g.held = h
	var drained chan struct{}
	if g.n > 0 {
		drained = make(chan struct{})
		g.drained = drained
	}
	g.mu.Unlock()
	if drained != nil {
		t := time.NewTimer(d)
		select {
		case <-drained:
		case <-t.C:
		}
		t.Stop()
	}
	return func() {
		g.mu.Lock()
		g.held, g.drained = nil, nil
		close(h)
		g.mu.Unlock()
	}
}
