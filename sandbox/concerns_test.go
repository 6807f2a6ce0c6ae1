package sandbox

import (
	"context"
	"errors"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// TestConcernsShareTheCore: the concern types Concerns hands out are the
// same on every call and work on the core's own live sandboxes: the
// registered running sandbox is counted by Meter, holds its template for
// Templates, and its files and commands calls reach it (the fake driver
// gives it no agent, so they fail as a dead agent does, not as an unknown
// session).
func TestConcernsShareTheCore(t *testing.T) {
	m, sb := newTestManager(t, &fakeDriver{})
	c := m.Concerns()
	if c != m.Concerns() {
		t.Fatal("Concerns returned different values on a second call")
	}
	if c.Files == nil || c.Commands == nil || c.Meter == nil || c.Templates == nil || c.Tenants == nil ||
		c.Recovery == nil || c.Runtimes == nil {
		t.Fatalf("a concern is missing: %+v", c)
	}
	if got := c.Meter.SessionStates(); got[string(node.StateRunning)] != 1 {
		t.Fatalf("session states %v, want the one running sandbox", got)
	}
	if !c.Templates.TemplateInUse("base") || c.Templates.TemplateInUse("other") {
		t.Fatal("template use does not follow the core's live sandboxes")
	}
	if !c.Templates.TemplateReferenced(context.Background(), "base") {
		t.Fatal("a template in use is not referenced")
	}
	if _, err := c.Files.Stat(context.Background(), "unknownsession000001", "/tmp", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("stat in an unknown session: %v, want not found", err)
	}
	if _, err := c.Commands.ProcessList(context.Background(), "unknownsession000001"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("process list of an unknown session: %v, want not found", err)
	}
	if _, err := c.Meter.Egress(context.Background(), sb.id, 0, 0); errdefs.Field(err) != "limit" {
		t.Fatalf("egress with limit 0: %v, want a 400 naming limit", err)
	}
	if recs, err := c.Meter.Egress(context.Background(), sb.id, 0, 10); err != nil || len(recs) != 0 {
		t.Fatalf("egress of a session without a network: %v, %v", recs, err)
	}
}

// TestRuntimesPickDriver: a create without isolation gets the default
// driver; an unknown one is a 400 naming isolation and listing the
// drivers; a network on a driver that cannot have one is a 400 naming
// network.
func TestRuntimesPickDriver(t *testing.T) {
	m, _ := newTestManager(t, &fakeDriver{})
	rt := m.Concerns().Runtimes
	req := node.CreateSpec{}
	if err := rt.pickDriver(&req); err != nil || req.Isolation != "fake" {
		t.Fatalf("default driver: %q, %v", req.Isolation, err)
	}
	if err := rt.pickDriver(&node.CreateSpec{Isolation: "nope"}); errdefs.Field(err) != "isolation" {
		t.Fatalf("unknown isolation: %v, want a 400 naming isolation", err)
	}
	if err := rt.pickDriver(&node.CreateSpec{Network: &node.Network{}}); errdefs.Field(err) != "network" {
		t.Fatalf("network on a driver without one: %v, want a 400 naming network", err)
	}
	info := rt.Info()
	if info.DefaultDriver != "fake" || len(info.Drivers) != 1 || info.Drivers[0].Name != "fake" || info.Limits != rt.Limits() {
		t.Fatalf("info %+v", info)
	}
	if _, ok := info.Drivers[0].Capabilities["memory_snapshot"]; !ok {
		t.Fatalf("capabilities by the API's names missing: %v", info.Drivers[0].Capabilities)
	}
}
