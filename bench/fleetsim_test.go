package bench

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/fleet"
)

// TestFleetSimStep runs one short step of each mode on a real
// three-node cluster and checks the harness: every kind of operation
// was measured, the directory holds exactly the sessions the simulation
// counts live, every simulated host's record is in the registry, and
// reset empties the buckets (never how fast anything was).
func TestFleetSimStep(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := startSimCluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.close()
	for _, read := range simReads {
		st := simStep{hosts: 6, rate: 10, live: 60, read: read, warmup: time.Second, length: 3 * time.Second}
		tally, err := runStep(ctx, c, st)
		if err != nil {
			t.Fatalf("%s: %v", read, err)
		}
		if tally.creates == 0 || tally.destroys == 0 || tally.heartbeats == 0 || len(tally.place) != tally.creates {
			t.Fatalf("%s: creates %d, destroys %d, heartbeats %d, place samples %d", read,
				tally.creates, tally.destroys, tally.heartbeats, len(tally.place))
		}
		if tally.diskBytes <= 0 {
			t.Fatalf("%s: stores on disk %d bytes", read, tally.diskBytes)
		}
		d, err := fleet.OpenDirectory(ctx, c.nodes[1])
		if err != nil {
			t.Fatal(err)
		}
		ls, err := d.List(ctx, fleet.KindSession, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(ls) != tally.liveAtEnd {
			t.Fatalf("%s: directory holds %d sessions, the simulation counts %d live", read, len(ls), tally.liveAtEnd)
		}
		reg, err := fleet.OpenRegistry(ctx, c.nodes[2], fleet.RegistryOptions{})
		if err != nil {
			t.Fatal(err)
		}
		hs, err := reg.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(hs) != st.hosts || !strings.HasPrefix(hs[0].ID, "sim-") {
			t.Fatalf("%s: registry holds %d hosts (%+v), want %d", read, len(hs), hs, st.hosts)
		}
		rows, _ := fleetSimRows(st, tally, 0)
		if len(rows) != 6 || rows[0].N == 0 || rows[0].Error != "" || rows[0].PerSecond == nil {
			t.Fatalf("%s: rows %+v", read, rows)
		}
		if err := c.reset(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.nodes[0].JetStream().KeyValue(ctx, fleet.LocationsBucket); err == nil {
		t.Fatal("the directory's bucket is still there after reset")
	}
}
