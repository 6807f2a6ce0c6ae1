package snapshot

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
)

// Memory snapshots (drivers with the memory_snapshot capability: gVisor).
//
// A memory snapshot is a files snapshot plus a checkpoint of the sandbox's
// processes and memory taken while it is frozen, so the two agree. The
// agent's socket is a host socket the runtime cannot save, so the agent is
// prepared first (it closes the socket and its connections) and resumed
// after (agent/checkpoint.go); the core does both (Held). The checkpoint is
// sealed (storage/seal: AES-256-GCM, sha256 manifest whose digest is in
// the database) into Layout.MemorySnapshots()/ID and its plaintext removed,
// after the call has answered (sealing.go).
//
// A session restored from it gets the snapshot's files in a new writable
// layer, the checkpoint decrypted (once for all the sessions of a fork,
// OpenMemory) and restored by the driver, and a control file that gives
// its agent a new hostname; /etc/machine-id is the session's own file and
// the kernel's random state is the host's, so both differ between clones.
// What cannot differ is the restored kernel's own state, such as
// /proc/sys/kernel/random/boot_id (gVisor keeps it in the checkpoint: every
// clone of a snapshot, and every session of a template's warm snapshot,
// reads the same boot id), and what the processes hold in their own memory: a
// user-space random generator seeded before the snapshot (Python's random,
// numpy) continues identically in every clone; such programs must reseed.

// memoryCapture is one memory snapshot in progress.
type memoryCapture struct {
	drv    runtime.Driver
	driver string // drv's name, recorded with the snapshot
	sb     Held
	id     string // the session's
	dir    string // plaintext checkpoint, removed by the caller
	gen    uint64
	err    error // the checkpoint's error
	// checkpointTime and resumeTime are how long the driver's checkpoint
	// and the agent's return took, for the log.
	checkpointTime, resumeTime time.Duration
}

// Generation is the handshake generation of snapshot snapID: its clones'
// agents wait for it, so it is derived from the id rather than stored
// (never 0, the generation of an agent that was not checkpointed).
func Generation(snapID string) uint64 {
	sum := sha256.Sum256([]byte(snapID))
	return binary.BigEndian.Uint64(sum[:8]) | 1
}

// prepareMemory checks that sb can be memory-snapshotted and prepares its
// agent for snapshot snapID. Called with sb locked.
func (s *Service) prepareMemory(ctx context.Context, sb Held, rec node.Session, snapID string) (*memoryCapture, error) {
	drv := sb.Driver()
	if !drv.Capabilities().MemorySnapshot {
		return nil, errdefs.InvalidField("memory", "isolation %q takes no memory snapshots (create the session with isolation %q)",
			drv.Name(), "gvisor")
	}
	if s.key == nil {
		return nil, fmt.Errorf("memory snapshots: %w: no snapshot key", errdefs.ErrUnavailable)
	}
	if rec.State != node.StateRunning {
		return nil, errdefs.Newf(errdefs.ErrConflict, "session %s is %s: a memory snapshot needs it running", rec.ID, rec.State)
	}
	mc := &memoryCapture{drv: drv, driver: drv.Name(), sb: sb, id: rec.ID, gen: Generation(snapID),
		dir: filepath.Join(s.layout.CheckpointScratch(), snapID)}
	if err := os.MkdirAll(s.layout.CheckpointScratch(), 0o700); err != nil {
		return nil, err
	}
	if err := os.Mkdir(mc.dir, 0o700); err != nil {
		return nil, err
	}
	if err := sb.PrepareCheckpoint(ctx, mc.gen); err != nil {
		os.RemoveAll(mc.dir)
		return nil, err
	}
	return mc, nil
}

// checkpoint runs the driver's checkpoint into mc.dir; a connection the
// agent is still closing makes it fail, so it is tried a few times.
func (mc *memoryCapture) checkpoint(ctx context.Context) {
	defer func(t time.Time) { mc.checkpointTime = time.Since(t) }(time.Now())
	for i := 0; i < 3; i++ {
		if i > 0 {
			os.RemoveAll(mc.dir)
			os.Mkdir(mc.dir, 0o700)
			time.Sleep(20 * time.Millisecond)
		}
		if mc.err = mc.drv.Checkpoint(ctx, mc.id, mc.dir); mc.err == nil {
			return
		}
	}
}

// resume lets the agent listen again and waits until it answers.
func (mc *memoryCapture) resume(ctx context.Context) {
	defer func(t time.Time) { mc.resumeTime = time.Since(t) }(time.Now())
	mc.sb.ResumeAfterCheckpoint(ctx, mc.gen)
}

// memoryDir is where snapshot id's sealed checkpoint is kept.
func (s *Service) memoryDir(id string) string {
	return filepath.Join(s.layout.MemorySnapshots(), id)
}
