package sandbox

import (
	"context"
	"time"

	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
)

// Meter owns what sessions use and what the host reports of them: a
// session's resource usage, its egress records (the sink each network
// attachment feeds and the recorder that writes them in batches) and the
// counts package metrics reads (metrics.Source). It is safe for
// concurrent use.
type Meter struct{ agentCalls }

// SessionStates counts the sessions that exist now by state, warm-pool
// members as "pooled" (metrics.Source).
func (mt *Meter) SessionStates() map[string]int {
	out := map[string]int{}
	mt.m.mu.Lock()
	defer mt.m.mu.Unlock()
	for _, sb := range mt.m.live {
		out[string(sb.Record().State)]++
	}
	return out
}

// DigestedEntries counts the entries the storage driver's snapshot
// digests and integrity checks walked in this process (metrics.Source).
func (mt *Meter) DigestedEntries() int64 { return storage.DigestedEntries() }

// SnapshotBytes sums what stored snapshots hold, in bytes: their files
// (over their parents) and their memory checkpoints (metrics.Source).
func (mt *Meter) SnapshotBytes() (files, memory int64) {
	snaps, err := mt.m.opts.Store.ListSnapshots(context.Background())
	if err != nil {
		return 0, 0
	}
	for _, sn := range snaps {
		files += sn.SizeBytes
		memory += sn.MemoryBytes
	}
	return files, memory
}

// Usage reads the session's CPU seconds, memory (now and peak, bytes),
// tasks, OOM kills and the bytes its writable layer holds.
func (mt *Meter) Usage(ctx context.Context, id string) (*node.Usage, error) {
	sb := mt.m.find(ctx, id)
	if sb == nil || !isLive(sb.Record().State) {
		_, _, err := mt.m.use(ctx, id) // the right error for an ended or unknown session
		return nil, err
	}
	st, err := mt.m.runtimes.driverOf(sb).Stats(ctx, id)
	if err != nil {
		if derr := mt.checkDead(ctx, id); derr != nil {
			return nil, derr // it died by itself: 410 with the reason
		}
		return nil, err
	}
	u := &node.Usage{CPUSeconds: st.CPUSeconds, MemoryBytes: st.MemoryBytes, MemoryPeakBytes: st.MemoryPeakBytes,
		Pids: st.Pids, OOMKills: st.OOMKills}
	if u.DiskBytes, err = mt.m.opts.Storage.Usage(ctx, id); err != nil {
		return nil, err
	}
	u.EgressBytes = mt.egressBytes(ctx, sb)
	return u, nil
}

// UsageHistory returns the monitor's samples of live session id in
// [from, to] (node.Sessions.UsageHistory). ErrNotFound, ErrTerminated as
// for Usage.
func (mt *Meter) UsageHistory(ctx context.Context, id string, from, to time.Time) ([]node.UsageSample, error) {
	sb := mt.m.find(ctx, id)
	if sb == nil || !isLive(sb.Record().State) {
		_, _, err := mt.m.use(ctx, id) // the right error for an ended or unknown session
		return nil, err
	}
	return mt.m.mon.UsageHistory(id, from, to), nil
}
