package fleetstate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/forkbox/forkbox/store"
)

func openAudits(t *testing.T, hosts []*host) []*Audit {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, len(hosts))
	out := make([]*Audit, len(hosts))
	for i, h := range hosts {
		octx, ocancel := context.WithTimeout(ctx, 30*time.Second)
		a, err := OpenAudit(octx, h.f, h.st, quietLog())
		ocancel()
		if err != nil {
			cancel()
			t.Fatalf("host %s: %v", h.id, err)
		}
		h.st.OnAudit(a.Notify)
		out[i] = a
		go func() { a.Run(ctx); done <- struct{}{} }()
	}
	t.Cleanup(func() {
		cancel()
		for range hosts {
			<-done
		}
	})
	return out
}

func appendN(t *testing.T, st *store.Store, tenant, kind string, n int) {
	t.Helper()
	for i := range n {
		err := st.AppendAudit(context.Background(), &store.AuditRecord{Tenant: tenant, Kind: kind, Outcome: "ok",
			Session: fmt.Sprintf("s%d", i), Detail: map[string]any{"i": i}})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// Records appended on a and b are read on c, each with its host, with
// the same filters as one host's store: tenant, kind (prefix too),
// session, and paging by after. Records a made before its publisher ran
// (as while the cluster had no quorum) are published from its store.
func TestFleetAudit(t *testing.T) {
	hosts := startHosts(t)
	ctx := context.Background()
	appendN(t, hosts[0].st, "acme", "exec", 3) // before any publisher runs
	as := openAudits(t, hosts)
	appendN(t, hosts[0].st, "acme", "session.create", 2)
	appendN(t, hosts[1].st, "acme", "exec", 4)
	appendN(t, hosts[1].st, "other", "exec", 5)

	c := as[2]
	var all []*store.AuditRecord
	waitFor(t, 10*time.Second, "every record of a and b readable on c", func() bool {
		var err error
		all, err = c.List(ctx, store.AuditFilter{})
		return err == nil && len(all) == 14
	})
	hostsSeen := map[string]int{}
	for i, r := range all {
		hostsSeen[r.Host]++
		if i > 0 && r.Seq <= all[i-1].Seq {
			t.Fatalf("records out of order: %d after %d", r.Seq, all[i-1].Seq)
		}
	}
	if hostsSeen["a"] != 5 || hostsSeen["b"] != 9 {
		t.Fatalf("records by host %v: want a 5, b 9", hostsSeen)
	}
	check := func(f store.AuditFilter, want int) []*store.AuditRecord {
		t.Helper()
		got, err := c.List(ctx, f)
		if err != nil || len(got) != want {
			t.Fatalf("List(%+v): %d records, %v; want %d", f, len(got), err, want)
		}
		return got
	}
	check(store.AuditFilter{Tenant: "acme"}, 9)
	check(store.AuditFilter{Tenant: "acme", Kind: "exec"}, 7)
	check(store.AuditFilter{Kind: "session."}, 2)
	check(store.AuditFilter{Tenant: "other", Session: "s2"}, 1)
	check(store.AuditFilter{Tenant: "nobody"}, 0)
	check(store.AuditFilter{Since: time.Now().Add(time.Hour)}, 0)
	page := check(store.AuditFilter{Tenant: "acme", Limit: 4}, 4)
	rest := check(store.AuditFilter{Tenant: "acme", After: page[3].Seq}, 5)
	if rest[0].Seq <= page[3].Seq {
		t.Fatalf("page after %d starts at %d", page[3].Seq, rest[0].Seq)
	}
	// A's cursor, as a restarted host reads it, is its last record; a
	// host publishing again from an older cursor stores nothing twice.
	if cur, err := as[0].cursor(ctx); err != nil || cur != 5 {
		t.Fatalf("a's cursor %d, %v: want 5", cur, err)
	}
	if _, err := as[0].publish(ctx, 0); err != nil {
		t.Fatal(err)
	}
	check(store.AuditFilter{}, 14)
}

// Records a makes while b and c are down (no quorum: nothing can be
// published) wait in a's store and reach the stream once b and c are
// back; none is lost or stored twice.
func TestFleetAuditWithoutQuorum(t *testing.T) {
	hosts := startHosts(t)
	ctx := context.Background()
	as := openAudits(t, hosts[:1])
	appendN(t, hosts[0].st, "acme", "exec", 2)
	waitFor(t, 10*time.Second, "a's first records in the stream", func() bool {
		l, err := as[0].List(ctx, store.AuditFilter{})
		return err == nil && len(l) == 2
	})
	hosts[1].stop()
	hosts[2].stop()
	appendN(t, hosts[0].st, "acme", "session.create", 3)
	if _, err := as[0].publish(ctx, 2); err == nil {
		t.Fatal("a publish without quorum succeeded")
	}
	hosts[1].restart(t)
	hosts[2].restart(t)
	// c reads them, through a reader of its own.
	var c *Audit
	waitFor(t, 60*time.Second, "c reads all five of a's records", func() bool {
		if c == nil {
			octx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			var err error
			if c, err = OpenAudit(octx, hosts[2].f, hosts[2].st, quietLog()); err != nil {
				c = nil
				return false
			}
		}
		l, err := c.List(ctx, store.AuditFilter{Tenant: "acme"})
		return err == nil && len(l) == 5 && l[4].Kind == "session.create" && l[4].Host == "a"
	})
}
