package monitor

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/abuse"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

var testLimits = runtime.Limits{CPU: 1, MemoryBytes: 256 << 20, Pids: 128}

// TestRoundEndsTenantOverBudget: a round reads the CPU real sandboxes
// used from their cgroups into the store, ends the sessions of a tenant
// past its daily budget (reason quota, recorded) and no other, after
// which admission refuses the tenant; the process listing the mining
// check uses sees a sandbox's process names, at most once per interval.
func TestRoundEndsTenantOverBudget(t *testing.T) {
	h := newHost(t)
	h.tenant("budget", tenancy.Policy{CPUSecondsPerDay: 1})
	h.tenant("free", tenancy.Policy{})
	busy := h.start("budget", testLimits)
	idle := h.start("free", testLimits)
	// A second and a half of CPU, however busy the host is.
	if code := busy.run(t, "python3", "-c", "import time\nwhile time.process_time() < 1.5: pass"); code != 0 {
		t.Fatalf("CPU burner exited %d", code)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	miner := idle.background(t, ctx, "python3", "-c", "open('/proc/self/comm', 'w').write('xmrig')\nimport signal\nsignal.pause()")
	defer miner.Close()

	mon := h.monitor(Options{})
	if !mon.round() {
		t.Fatal("the round ran out of its interval")
	}
	got := h.waitEnded()
	if got.id != busy.ID() || got.reason != node.ReasonQuota || !strings.Contains(got.detail, "CPU budget") {
		t.Fatalf("ended %+v, want %s with reason quota", got, busy.ID())
	}
	used, err := h.st.TenantCPU(ctx, "budget", time.Now())
	if err != nil || used < 1400 {
		t.Fatalf("tenant CPU %d ms (%v), want the 1.5 s it used", used, err)
	}
	recs, err := h.st.ListAudit(ctx, store.AuditFilter{Tenant: "budget", Kind: "policy"})
	if err != nil || len(recs) != 1 || recs[0].Detail["rule"] != node.ProblemCPUBudgetExhausted {
		t.Fatalf("policy records %+v %v, want one cpu-budget-exhausted", recs, err)
	}
	tr, p, err := h.adm.Tenant(ctx, "budget")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.adm.Admit(ctx, tr, p, 64); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("admit after the budget was used up: %v", err)
	}
	if st := idle.Record().State; st != node.StateRunning {
		t.Fatalf("the other tenant's session is %s", st)
	}

	// The mining check's process listing: names from the host, then
	// nothing until processListInterval has passed.
	var names []string
	waitFor(t, func() bool {
		delete(mon.listed, idle.ID())
		names = names[:0]
		for _, p := range mon.processes(ctx, idle)() {
			names = append(names, p.Name)
		}
		return slices.Contains(names, "xmrig")
	})
	if again := mon.processes(ctx, idle)(); again != nil {
		t.Fatalf("listed again within the interval: %+v", again)
	}
}

// TestRoundEndsForkBomb: a real sandbox that sits at its pids limit in
// enough samples is ended for abuse (fork-bomb), its tenant is flagged
// and the kill recorded, once, however many times it is reported.
func TestRoundEndsForkBomb(t *testing.T) {
	h := newHost(t)
	h.tenant("bomber", tenancy.Policy{})
	limits := testLimits
	limits.Pids = 24
	sb := h.start("bomber", limits)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bomb := sb.background(t, ctx, "python3", "-c", forkFill)
	defer bomb.Close()
	mon := h.monitor(Options{Abuse: abuse.Config{PidsHits: 2}})
	waitFor(t, func() bool {
		st, err := mon.sample(ctx, sb)
		return err == nil && st.Pids >= limits.Pids
	})
	var got ending
	for i := 0; ; i++ {
		mon.round()
		select {
		case got = <-h.ended:
		case <-time.After(200 * time.Millisecond):
			if i > 50 {
				t.Fatal("no verdict after 50 rounds at the pids limit")
			}
			continue
		}
		break
	}
	if got.id != sb.ID() || got.reason != node.ReasonAbuse || !strings.Contains(got.detail, "pids limit") {
		t.Fatalf("ended %+v, want %s for abuse", got, sb.ID())
	}
	// A second report (a call that saw it too) ends it again, records nothing more.
	mon.EndForAbuse(sb, abuse.Verdict{Pattern: abuse.ForkBomb, Reason: "again"}, node.ReasonPidsLimit)
	// The flag and the record follow the end (its notification above
	// can come first): wait for them, then see there is exactly one.
	var recs []*store.AuditRecord
	waitFor(t, func() bool {
		recs, _ = h.st.ListAudit(ctx, store.AuditFilter{Kind: "abuse"})
		return len(recs) > 0
	})
	tn, err := h.st.GetTenant(ctx, "bomber")
	if err != nil || tn.FlaggedAt.IsZero() || !strings.Contains(tn.FlagReason, abuse.ForkBomb) {
		t.Fatalf("tenant %+v %v, want it flagged for a fork bomb", tn, err)
	}
	if len(recs) != 1 || recs[0].Session != sb.ID() {
		t.Fatalf("abuse records %+v, want one", recs)
	}
}

// TestRoundGoneAndOrphaned: a session whose tenant was deleted is ended
// (reason deleted) without a sample; one whose sandbox the runtime does
// not know any more is handed to CheckDead.
func TestRoundGoneAndOrphaned(t *testing.T) {
	h := newHost(t)
	h.tenant("alive", tenancy.Policy{})
	orphan := &testSandbox{rec: node.Session{ID: "mtorphan1", State: node.StateRunning, Tenant: "deleted-tenant"}}
	dead := &testSandbox{rec: node.Session{ID: "mtdead1", State: node.StateRunning, Tenant: "alive"}}
	h.sbs[orphan.ID()], h.sbs[dead.ID()] = orphan, dead
	mon := h.monitor(Options{})
	mon.round()
	if got := h.waitEnded(); got.id != orphan.ID() || got.reason != node.ReasonDeleted {
		t.Fatalf("ended %+v, want %s with reason deleted", got, orphan.ID())
	}
	select {
	case id := <-h.checks:
		if id != dead.ID() {
			t.Fatalf("CheckDead(%s), want %s", id, dead.ID())
		}
	default:
		t.Fatal("a sandbox the runtime does not know was not checked")
	}
}

// forkFill forks children that wait until the pids limit refuses one,
// then waits itself.
const forkFill = `import os, signal
try:
    while True:
        if os.fork() == 0:
            signal.pause()
            os._exit(0)
except OSError:
    pass
signal.pause()
`

// waitFor polls cond until it holds, failing after a generous guard.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestCountCPU: the CPU a warm-pool member used before it was claimed is
// counted for nobody (ClearCPU); after the claim, the last reading before
// a teardown (CountCPU) charges the tenant what the sandbox used since;
// a member still in the pool is charged to nobody.
func TestCountCPU(t *testing.T) {
	h := newHost(t)
	h.tenant("claimer", tenancy.Policy{})
	sb := h.start("", testLimits)
	sb.rec.State = node.StatePooled
	burn := func() {
		if code := sb.run(t, "python3", "-c", "import time\nwhile time.process_time() < 0.6: pass"); code != 0 {
			t.Fatalf("CPU burner exited %d", code)
		}
	}
	burn()
	mon := h.monitor(Options{})
	ctx := context.Background()
	mon.CountCPU(ctx, sb) // a pool member: nobody's
	mon.ClearCPU(ctx, sb)
	sb.mu.Lock()
	sb.rec.State, sb.rec.Tenant = node.StateRunning, "claimer"
	sb.mu.Unlock()
	mon.CountCPU(ctx, sb)
	before, err := h.st.TenantCPU(ctx, "claimer", time.Now())
	if err != nil || before >= 500 {
		t.Fatalf("charged %d ms (%v) for what the member used in the pool", before, err)
	}
	burn()
	mon.CountCPU(ctx, sb)
	after, err := h.st.TenantCPU(ctx, "claimer", time.Now())
	if err != nil || after-before < 500 {
		t.Fatalf("charged %d ms then %d ms (%v), want the 0.6 s used after the claim", before, after, err)
	}
}
