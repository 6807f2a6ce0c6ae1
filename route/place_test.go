package route

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/node"
)

func TestChoose(t *testing.T) {
	host := func(id string, sessions, slots int) fleet.Host {
		return fleet.Host{ID: id, Placeable: true, Tiers: []string{"runc"}, Templates: []string{"base", "py"},
			Capacity: fleet.Capacity{Sessions: slots, MemoryMB: 4096}, Load: fleet.Load{Sessions: sessions, MemoryMB: int64(sessions) * 512}}
	}
	a, b, c := host("a", 4, 10), host("b", 1, 10), host("c", 2, 10)
	pick := func(hs []fleet.Host, pending map[string]int, w Want) string {
		t.Helper()
		h, err := Choose(hs, pending, "a", w)
		if err != nil {
			t.Fatalf("Choose: %v", err)
		}
		return h.ID
	}
	if got := pick([]fleet.Host{a, b, c}, nil, Want{}); got != "b" {
		t.Errorf("least loaded: %s", got)
	}
	// Placements not yet in b's record count.
	if got := pick([]fleet.Host{a, b, c}, map[string]int{"b": 2}, Want{}); got != "c" {
		t.Errorf("with pending: %s", got)
	}
	// A ready warm-pool member wins over load.
	a.WarmReady = map[string]int{"py": 1}
	if got := pick([]fleet.Host{a, b, c}, nil, Want{Template: "py"}); got != "a" {
		t.Errorf("warm: %s", got)
	}
	a.WarmReady = nil
	// Ties go to self.
	if got := pick([]fleet.Host{host("a", 1, 10), b}, nil, Want{}); got != "a" {
		t.Errorf("tie: %s", got)
	}
	// Tier, template, placeability, slots and memory filter.
	g := host("g", 5, 10)
	g.Tiers = []string{"runc", "gvisor"}
	if got := pick([]fleet.Host{a, b, g}, nil, Want{Tier: "gvisor"}); got != "g" {
		t.Errorf("tier: %s", got)
	}
	r := host("r", 5, 10)
	r.Templates = append(r.Templates, "rust")
	if got := pick([]fleet.Host{a, b, r}, nil, Want{Template: "rust"}); got != "r" {
		t.Errorf("template: %s", got)
	}
	b.Placeable = false
	if got := pick([]fleet.Host{a, b, c}, nil, Want{}); got != "c" {
		t.Errorf("not placeable: %s", got)
	}
	full := host("f", 10, 10)
	if got := pick([]fleet.Host{full, c}, nil, Want{}); got != "c" {
		t.Errorf("no slot: %s", got)
	}
	if got := pick([]fleet.Host{host("m", 1, 10), c}, nil, Want{MemoryMB: 3000}); got != "m" {
		t.Errorf("memory: %s", got)
	}
	if _, err := Choose([]fleet.Host{full, host("n", 7, 10)}, map[string]int{"n": 3}, "a", Want{}); err == nil {
		t.Error("a full fleet placed a session")
	} else {
		var te *errdefs.TypedError
		if !errors.As(err, &te) || te.Type != node.ProblemCapacity || te.Class != errdefs.ErrUnavailable || te.RetryAfter != 5*time.Second {
			t.Errorf("full fleet: %#v", err)
		}
	}
	if _, err := Choose(nil, nil, "a", Want{}); err == nil {
		t.Error("no hosts placed a session")
	}
}

// TestPlacementsPending: a placement counts until its host's record is
// written a second after it.
func TestPlacementsPending(t *testing.T) {
	var p placements
	p.add("b")
	p.add("b")
	now := time.Now()
	if got := p.pending([]fleet.Host{{ID: "b", Heartbeat: now.Add(-time.Second)}}); got["b"] != 2 {
		t.Errorf("before b's next record: %v", got)
	}
	if got := p.pending([]fleet.Host{{ID: "b", Heartbeat: now.Add(2 * time.Second)}}); got["b"] != 0 {
		t.Errorf("after: %v", got)
	}
}

// TestIdempotentBound: the router remembers at most maxIdempotent keys,
// forgetting the oldest first.
func TestIdempotentBound(t *testing.T) {
	var m idempotent
	for i := 0; i <= maxIdempotent; i++ {
		m.put(string(rune('a'+i%26))+strconv.Itoa(i), "b")
	}
	if _, ok := m.get("a0"); ok {
		t.Error("the oldest key is still remembered")
	}
	if h, ok := m.get("b1"); !ok || h != "b" {
		t.Errorf("the second key: %q %v", h, ok)
	}
	if len(m.host) != maxIdempotent || len(m.order) != maxIdempotent {
		t.Errorf("%d keys, %d in order", len(m.host), len(m.order))
	}
}
