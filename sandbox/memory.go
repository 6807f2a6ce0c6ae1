package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/agent"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/storage/seal"
)

// Memory snapshots (drivers with the memory_snapshot capability: gVisor).
//
// A memory snapshot is a files snapshot plus a checkpoint of the sandbox's
// processes and memory taken while it is frozen, so the two agree. The
// agent's socket is a host socket the runtime cannot save, so the agent is
// prepared first (it closes the socket and its connections) and resumed
// after (agent/checkpoint.go). The checkpoint is sealed (storage/seal:
// AES-256-GCM, sha256 manifest whose digest is in the database) into
// Layout.MemorySnapshots()/ID and its plaintext removed.
//
// A session restored from it gets the snapshot's files in a new writable
// layer, the checkpoint decrypted (once for all the sessions of a fork)
// and restored by the driver, and a control file that gives its agent a
// new hostname; /etc/machine-id is the session's own file and the kernel's
// random state is the host's, so both differ between clones. What cannot
// differ is what the processes hold in their own memory: a user-space
// random generator seeded before the snapshot (Python's random, numpy)
// continues identically in every clone; such programs must reseed.

// memoryCapture is one memory snapshot in progress.
type memoryCapture struct {
	drv  runtime.Driver
	dir  string // plaintext checkpoint, removed by done
	gen  uint64
	err  error // the checkpoint's error
	sb   *Sandbox
	host string
	// checkpointTime and resumeTime are how long the driver's checkpoint
	// and the agent's return took, for the log.
	checkpointTime, resumeTime time.Duration
}

// generationOf is the handshake generation of snapshot snapID: its clones'
// agents wait for it, so it is derived from the id rather than stored.
func generationOf(snapID string) uint64 {
	sum := sha256.Sum256([]byte(snapID))
	return binary.BigEndian.Uint64(sum[:8]) | 1
}

// prepareMemory checks that sb can be memory-snapshotted and prepares its
// agent for snapshot snapID. Called with sb.lifeMu held.
func (m *Manager) prepareMemory(ctx context.Context, sb *Sandbox, rec node.Session, snapID string) (*memoryCapture, error) {
	drv := m.driverOf(sb)
	if !drv.Capabilities().MemorySnapshot {
		return nil, errdefs.InvalidField("memory", "isolation %q takes no memory snapshots (create the session with isolation %q)",
			drv.Name(), "gvisor")
	}
	if m.opts.SnapshotKey == nil {
		return nil, fmt.Errorf("memory snapshots: %w: no snapshot key", errdefs.ErrUnavailable)
	}
	if rec.State != node.StateRunning {
		return nil, errdefs.Newf(errdefs.ErrConflict, "session %s is %s: a memory snapshot needs it running", sb.id, rec.State)
	}
	mc := &memoryCapture{drv: drv, gen: generationOf(snapID), sb: sb, host: sb.id,
		dir: filepath.Join(m.opts.Layout.CheckpointScratch(), snapID)}
	if err := os.MkdirAll(m.opts.Layout.CheckpointScratch(), 0o700); err != nil {
		return nil, err
	}
	if err := os.Mkdir(mc.dir, 0o700); err != nil {
		return nil, err
	}
	// A resume file left from before (generation 0, written when a
	// restarted daemon adopted the sandbox) would end the prepare at once.
	if err := os.Remove(filepath.Join(sb.dir, "ctl", runtime.ControlFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		os.RemoveAll(mc.dir)
		return nil, err
	}
	// The prepared agent closes every connection: the exec streams it cuts
	// end with a clear error (streamCut), not a protocol one.
	sb.streamCuts.Add(1)
	if err := sb.agent.PrepareCheckpoint(ctx, mc.gen); err != nil {
		os.RemoveAll(mc.dir)
		return nil, err
	}
	sb.agent.Close()
	// The agent unlinks its socket when it has closed it (looked at
	// without following a link the sandbox may have put there).
	sockFile, err := guest.SocketFile(sb.agent.Socket())
	if err != nil {
		os.RemoveAll(mc.dir)
		return nil, err
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Lstat(sockFile); errors.Is(err, os.ErrNotExist) {
			break
		}
		if time.Now().After(deadline) {
			mc.resume(ctx, m)
			return nil, fmt.Errorf("prepare agent for a checkpoint: %w: it still listens", errdefs.ErrUnavailable)
		}
		time.Sleep(time.Millisecond)
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
		if mc.err = mc.drv.Checkpoint(ctx, mc.sb.id, mc.dir); mc.err == nil {
			return
		}
	}
}

// resume lets the agent listen again and waits until it answers.
func (mc *memoryCapture) resume(ctx context.Context, m *Manager) {
	defer func(t time.Time) { mc.resumeTime = time.Since(t) }(time.Now())
	if err := writeResume(filepath.Join(mc.sb.dir, "ctl"), agent.ResumeFile{Generation: mc.gen, Hostname: mc.host}); err != nil {
		m.log.Error("write resume file", "session", mc.sb.id, "err", err)
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := mc.sb.agent.WaitReady(rctx); err != nil {
		m.log.Error("agent did not come back after a checkpoint", "session", mc.sb.id, "err", err)
	}
}

// writeResume writes rf as dir's control file (atomically: the agent
// polls it), creating dir readable by the sandbox.
func writeResume(dir string, rf agent.ResumeFile) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	data, err := json.Marshal(rf)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+runtime.ControlFile+".tmp")
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, runtime.ControlFile))
}

// sealMemory seals the checkpoint into the snapshot's memory directory and
// fills sn's memory fields; the plaintext is removed either way.
func (m *Manager) sealMemory(mc *memoryCapture, sn *node.Snapshot) error {
	defer os.RemoveAll(mc.dir)
	if err := os.MkdirAll(m.opts.Layout.MemorySnapshots(), 0o700); err != nil {
		return err
	}
	digest, n, err := seal.SealDir(m.opts.SnapshotKey, mc.dir, m.memoryDir(sn.ID))
	if err != nil {
		return fmt.Errorf("seal checkpoint: %w", err)
	}
	sn.MemoryDriver, sn.MemoryDigest, sn.MemoryBytes = mc.drv.Name(), digest, n
	return nil
}

// memoryDir is where snapshot id's sealed checkpoint is kept.
func (m *Manager) memoryDir(id string) string {
	return filepath.Join(m.opts.Layout.MemorySnapshots(), id)
}

// openImage is a memory checkpoint decrypted for restores; the sessions
// of one fork share it.
type openImage struct {
	ready chan struct{}
	dir   string
	err   error
	users int
}

// openMemory verifies and decrypts snapshot sn's checkpoint (or joins a
// restore that did) and returns its directory and a release function. A
// tampered or truncated image is ErrConflict and nothing is started.
func (m *Manager) openMemory(sn *node.Snapshot) (string, func(), error) {
	m.imgMu.Lock()
	im := m.images[sn.ID]
	first := im == nil
	if first {
		im = &openImage{ready: make(chan struct{})}
		m.images[sn.ID] = im
	}
	im.users++
	m.imgMu.Unlock()
	release := func() {
		m.imgMu.Lock()
		defer m.imgMu.Unlock()
		if im.users--; im.users == 0 {
			delete(m.images, sn.ID)
			os.RemoveAll(im.dir)
		}
	}
	if first {
		im.dir = filepath.Join(m.opts.Layout.Scratch(), "restore-"+sn.ID+"-"+newID()[:8])
		if err := os.MkdirAll(m.opts.Layout.Scratch(), 0o700); err != nil {
			im.err = err
		} else if m.opts.SnapshotKey == nil {
			im.err = fmt.Errorf("memory snapshots: %w: no snapshot key", errdefs.ErrUnavailable)
		} else {
			im.err = seal.OpenDir(m.opts.SnapshotKey, m.memoryDir(sn.ID), sn.MemoryDigest, im.dir)
		}
		close(im.ready)
	} else {
		<-im.ready
	}
	if im.err != nil {
		release()
		return "", nil, fmt.Errorf("snapshot %s: %w", sn.ID, im.err)
	}
	return im.dir, release, nil
}
