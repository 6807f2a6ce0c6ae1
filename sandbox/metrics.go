package sandbox

import (
	"context"

	"github.com/forkbox/forkbox/storage"
)

// SessionStates counts the sessions that exist now by state, warm-pool
// members as "pooled" (metrics.Source).
func (m *Manager) SessionStates() map[string]int {
	out := map[string]int{}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, sb := range m.live {
		out[string(sb.Record().State)]++
	}
	return out
}

// DigestedEntries counts the entries the storage driver's snapshot
// digests and integrity checks walked in this process (metrics.Source).
func (m *Manager) DigestedEntries() int64 { return storage.DigestedEntries() }

// SnapshotBytes sums what stored snapshots hold, in bytes: their files
// (over their parents) and their memory checkpoints (metrics.Source).
func (m *Manager) SnapshotBytes() (files, memory int64) {
	snaps, err := m.opts.Store.ListSnapshots(context.Background())
	if err != nil {
		return 0, 0
	}
	for _, sn := range snaps {
		files += sn.SizeBytes
		memory += sn.MemoryBytes
	}
	return files, memory
}
