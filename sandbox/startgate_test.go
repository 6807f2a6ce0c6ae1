package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestStartGate: a hold waits for the start in flight and keeps new
// starts out until it lets go; a start whose context ends while the gate
// is held gives up with the context's error; a start that never ends
// holds a pause up only for the bound.
func TestStartGate(t *testing.T) {
	var g startGate
	if err := g.enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	held := make(chan func())
	go func() { held <- g.hold(time.Minute) }()
	select {
	case <-held:
		t.Fatal("the hold did not wait for the start in flight")
	case <-time.After(50 * time.Millisecond):
	}
	g.leave()
	release := <-held

	entered := make(chan error, 1)
	go func() { entered <- g.enter(context.Background()) }()
	select {
	case err := <-entered:
		t.Fatalf("a start entered a held gate: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.enter(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled start at a held gate: %v", err)
	}
	release()
	if err := <-entered; err != nil {
		t.Fatal(err)
	}

	// That start never leaves: a hold gives up waiting after its bound.
	done := make(chan struct{})
	go func() { g.hold(10 * time.Millisecond)(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute): // a hang guard
		t.Fatal("a hold waited past its bound for a start that never ends")
	}
	g.leave()
	if err := g.enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	g.leave()
}
