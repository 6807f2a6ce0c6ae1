package agent

import (
	"os"
	"testing"
	"time"

	"github.com/forkbox/forkbox/internal/envdpb/processpb"
)

// TestPumpReadsPendingAfterDeadline proves output already in the pipe is
// read even when the drain deadline expired before pump got to read it.
func TestPumpReadsPendingAfterDeadline(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close() // kept open: no EOF, only the deadline ends the pump
	if _, err := w.Write([]byte("last words")); err != nil {
		t.Fatal(err)
	}
	if err := r.SetReadDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	sub := newSubscriber(nil)
	p := &proc{subs: map[*subscriber]struct{}{sub: {}}, done: make(chan struct{})}
	p.pump(r, make(chan struct{}), func(b []byte) *processpb.ProcessEvent_DataEvent {
		return &processpb.ProcessEvent_DataEvent{Output: &processpb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
	})
	var got []byte
	for len(sub.ch) > 0 {
		got = append(got, (<-sub.ch).GetData().GetStdout()...)
	}
	if string(got) != "last words" {
		t.Fatalf("pump delivered %q, want the pending %q", got, "last words")
	}
}

// TestFinishReachesLateSubscriber proves a subscriber that arrives while the
// end event is being delivered still gets it (from finish or from subscribe).
func TestFinishReachesLateSubscriber(t *testing.T) {
	for i := 0; i < 200; i++ {
		first := newSubscriber(nil)
		p := &proc{subs: map[*subscriber]struct{}{first: {}}, done: make(chan struct{})}
		late := newSubscriber(nil)
		go p.subscribe(late)
		p.finish(endFromStatus(0))
		select {
		case ev := <-late.ch:
			if ev.GetEnd() == nil {
				t.Fatalf("late subscriber got %v, want the end event", ev)
			}
		case <-time.After(hangGuard):
			t.Fatal("a subscriber that arrived during finish never got the end event")
		}
		if ev := <-first.ch; ev.GetEnd() == nil {
			t.Fatalf("first subscriber got %v", ev)
		}
	}
}
