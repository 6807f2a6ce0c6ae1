package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/runtime/runsc"
)

// The gVisor tier's rows: exec through the agent, and memory snapshot,
// restore and fork of a sandbox with residentMB of process memory;
// interleaved with them the runsc CLI doing the same (exec, checkpoint
// --leave-running, restore) on a container holding as much.

const (
	// residentMB is the memory (10^6 bytes) a process holds in the sandbox
	// before the memory snapshot rows (DESIGN.md: "a 100 MB sandbox").
	residentMB = 100
	// gvisorForkCount is how many sessions the gVisor fork row starts.
	gvisorForkCount = 5
	// gvisorMaxN caps the measured iterations of the memory snapshot rows:
	// each one moves residentMB through the disk (and the fork row five
	// times that).
	gvisorMaxN = 10
	// gvisorForkMaxN caps the measured rounds of the gVisor fork row
	// (five restores a round, for each system).
	gvisorForkMaxN = 5
	// driverGVisor is the gVisor driver's isolation name.
	driverGVisor = "gvisor"
)

// holdMemory is the command that keeps residentMB of random bytes in a
// process's memory and then marks /tmp/ready.
var holdMemory = fmt.Sprintf(`python3 -c 'import os, time
held = os.urandom(%d)
open("/tmp/ready", "w").write("1")
time.sleep(1e6)'`, residentMB*1_000_000)

// measureGVisor measures the gVisor rows when the daemon has the gvisor
// driver (otherwise each row says why it is missing), each interleaved with
// the runsc CLI doing the same on a container holding as much memory:
// exec of `true` (`runsc exec`), the memory snapshot of a sandbox holding
// residentMB (`runsc checkpoint --leave-running`), a restore of it into a
// new session until its agent answers (`runsc restore --detach`), and a
// fork of gvisorForkCount sessions from it, the whole call (as many
// `runsc restore --detach` at once).
func (e *env) measureGVisor(ctx context.Context) []Result {
	f := e.fb
	ops := []string{OpGVisorExec, OpMemSnapshot, OpMemRestore, OpMemFork}
	if !f.hasDriver(ctx, driverGVisor) {
		return failOps(ops, SystemForkbox, errors.New("the daemon has no gvisor driver (install runsc from bookworm-backports)"))
	}
	w, n, mn := e.opts.Warmup, e.opts.N, min(e.opts.N, gvisorMaxN)
	var rs *runscPeer
	var peerRows []Result
	if e.p != nil {
		var cleanup func()
		var err error
		rs, cleanup, err = openRunsc(ctx, e.opts, e.p.versions)
		defer cleanup()
		if err != nil {
			peerRows, rs = failOps(ops, SystemRunsc, err), nil
		}
	}
	// peer returns the runsc contender for a step, none without runsc.
	peer := func(step func(ctx context.Context) (time.Duration, error)) []contender {
		if rs == nil {
			return nil
		}
		return []contender{{system: SystemRunsc, step: one(step)}}
	}

	s, _, err := f.createWith(ctx, client.CreateRequest{Isolation: driverGVisor})
	if err != nil {
		return append(failOps(ops, SystemForkbox, err), peerRows...)
	}
	defer f.destroy(ctx, s.ID) // a no-op once destroyed below; close retries
	e.opts.progressf("gVisor: exec true x %d, interleaved with runsc exec", w+n)
	rows := interleave(ctx, w, n, ops[:1], slices.Concat([]contender{{system: SystemForkbox,
		step: one(func(ctx context.Context) (time.Duration, error) { return f.exec(ctx, s.ID) })}},
		peer(func(ctx context.Context) (time.Duration, error) { return rs.tool.run(ctx, "exec", rs.id, "true") })))

	e.opts.progressf("gVisor: hold %d MB in a process, memory snapshot x %d, interleaved with runsc checkpoint", residentMB, w+mn)
	if err := f.holdMemory(ctx, s.ID); err != nil {
		return append(append(rows, failOps(ops[1:], SystemForkbox, err)...), peerRows...)
	}
	var last *client.Snapshot
	snapRows := interleave(ctx, w, mn, ops[1:2], slices.Concat([]contender{{system: SystemForkbox,
		step: one(func(ctx context.Context) (time.Duration, error) {
			if last != nil {
				if err := f.deleteSnapshot(ctx, last.ID, true); err != nil {
					return 0, err
				}
				last = nil
			}
			return timedCall("memory snapshot "+s.ID, func() error {
				sn, err := f.c.SnapshotWith(ctx, s.ID, client.SnapshotRequest{Memory: true, ExpiresInS: snapshotExpiryS})
				if err == nil {
					f.mu.Lock()
					f.snaps[sn.ID] = true
					f.mu.Unlock()
					last = sn
				}
				return err
			})
		})}}, peer(rs.checkpoint)))
	rows = append(rows, dataRows(snapRows, residentMB)...)
	if snapRows[0].Error != "" || last == nil {
		return append(append(rows, failOps(ops[2:], SystemForkbox, errors.New("no memory snapshot"))...), peerRows...)
	}
	if _, err := f.destroy(ctx, s.ID); err != nil {
		return append(append(rows, failOps(ops[2:], SystemForkbox, err)...), peerRows...)
	}
	defer func() {
		if err := f.deleteSnapshot(ctx, last.ID, true); err != nil {
			e.opts.progressf("gVisor: delete snapshot %s: %v", last.ID, err)
		}
	}()

	e.opts.progressf("gVisor: restore x %d, fork %d x %d, interleaved with runsc restore", w+mn, gvisorForkCount,
		min(w, heavyWarmup)+min(mn, gvisorForkMaxN))
	rows = append(rows, dataRows(interleave(ctx, w, mn, ops[2:3], slices.Concat([]contender{{system: SystemForkbox,
		step: one(func(ctx context.Context) (time.Duration, error) {
			r, d, err := f.createWith(ctx, client.CreateRequest{Snapshot: last.ID})
			if err != nil {
				return 0, err
			}
			_, err = f.destroy(ctx, r.ID)
			return d, err
		})}}, peer(func(ctx context.Context) (time.Duration, error) { return rs.restoreN(ctx, 1) }))), residentMB)...)
	rows = append(rows, dataRows(interleave(ctx, min(w, heavyWarmup), min(mn, gvisorForkMaxN), ops[3:], slices.Concat([]contender{{system: SystemForkbox,
		step: one(func(ctx context.Context) (time.Duration, error) {
			var res *client.ForkResult
			d, err := timedCall("fork "+last.ID, func() (err error) {
				res, err = f.c.ForkSnapshot(ctx, last.ID, client.ForkRequest{Count: gvisorForkCount,
					CreateRequest: client.CreateRequest{Metadata: f.labels()}})
				return err
			})
			if err != nil {
				return 0, err
			}
			var ids []string
			for _, fs := range res.Sessions {
				f.track(fs.ID)
				ids = append(ids, fs.ID)
			}
			return d, f.destroyAll(ctx, ids)
		})}}, peer(func(ctx context.Context) (time.Duration, error) { return rs.restoreN(ctx, gvisorForkCount) }))), residentMB)...)
	return append(rows, peerRows...)
}

// hasDriver reports whether the daemon lists the isolation driver name.
func (f *forkbox) hasDriver(ctx context.Context, name string) bool {
	info, err := f.c.Info(ctx)
	if err != nil {
		return false
	}
	for _, d := range info.Drivers {
		if d.Name == name {
			return true
		}
	}
	return false
}

// holdMemory starts holdMemory in session id and waits until it holds it.
func (f *forkbox) holdMemory(ctx context.Context, id string) error {
	if _, err := f.c.ExecBackground(ctx, id, client.ExecRequest{Cmd: holdMemory}); err != nil {
		return fmt.Errorf("hold memory in %s: %w", id, err)
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		out, err := f.c.ExecCollect(ctx, id, client.ExecRequest{Argv: []string{"test", "-f", "/tmp/ready"}})
		if err == nil && out.ExitCode == 0 {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("hold memory in %s: not ready within a minute", id)
}

// failOps returns a failed row of system for each of ops.
func failOps(ops []string, system string, err error) []Result {
	rows := make([]Result, 0, len(ops))
	for _, op := range ops {
		rows = append(rows, newResult(op, system, nil, err))
	}
	return rows
}

// runscPeer is the runsc CLI (systrap, no network) with a private state
// root, and a container whose root is the host's, read-only, with a tmpfs
// /tmp, holding residentMB in a process.
type runscPeer struct {
	tool   tool
	dir    string // temporary directory: state, bundle, image
	bundle string
	image  string // where checkpoint writes and restore reads
	id     string // the running container

	mu  sync.Mutex
	ids []string // every container made, deleted by cleanup
	seq int
}

// peerRunsc returns the runsc the peer runs: the one forkbox's gVisor
// driver runs by default (runsc.PinnedBinary when installed, else runsc in
// PATH), so that the rows compare forkbox with the same runsc version
// (a 2024 and a 2026 runsc differ by 2-4x in checkpoint and restore).
func peerRunsc() (string, error) {
	if st, err := os.Stat(runsc.PinnedBinary); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
		return runsc.PinnedBinary, nil
	}
	bin, err := exec.LookPath("runsc")
	if err != nil {
		return "", errors.New("runsc is not installed")
	}
	return bin, nil
}

// openRunsc starts the runsc peer's container and waits until it holds
// its memory. cleanup deletes every container it made and its directory
// (call it also on error). versions gets runsc's line.
func openRunsc(ctx context.Context, opts Options, versions map[string]string) (rs *runscPeer, cleanup func(), err error) {
	cleanup = func() {}
	bin, err := peerRunsc()
	if err != nil {
		return nil, cleanup, err
	}
	dir, err := os.MkdirTemp("", "forkbox-bench-runsc-*")
	if err != nil {
		return nil, cleanup, err
	}
	rs = &runscPeer{dir: dir, bundle: filepath.Join(dir, "bundle"), image: filepath.Join(dir, "image"),
		id: fmt.Sprintf("fbb-runsc-%d", os.Getpid())}
	rs.tool = tool{bin: bin, pre: []string{"--root", filepath.Join(dir, "state"), "--platform=systrap", "--network=none"}, dir: dir}
	cleanup = func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		for _, c := range rs.ids {
			_, _ = rs.tool.run(cctx, "delete", "--force", c)
		}
		// The 2026 runsc keeps a null network namespace mounted in its
		// state root.
		if err := runsc.ReleaseRoot(filepath.Join(dir, "state")); err != nil {
			opts.progressf("runsc: %v", err)
		}
		if err := removeTree(dir); err != nil {
			opts.progressf("runsc: %v", err)
		}
	}
	versions[SystemRunsc] = rs.tool.version(ctx)
	if err := runscBundle(ctx, bin, rs.bundle); err != nil {
		return nil, cleanup, err
	}
	rs.ids = append(rs.ids, rs.id)
	if err := rs.tool.start(ctx, "run", "--detach", "--bundle", rs.bundle, rs.id); err != nil {
		return nil, cleanup, err
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if _, err := rs.tool.run(ctx, "exec", rs.id, "test", "-f", "/tmp/ready"); err == nil {
			return rs, cleanup, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, cleanup, errors.New("runsc: the container did not fill its memory within a minute")
}

// checkpoint is `runsc checkpoint --leave-running` of the container into
// the image directory (emptied first, untimed).
func (rs *runscPeer) checkpoint(ctx context.Context) (time.Duration, error) {
	if err := os.RemoveAll(rs.image); err != nil {
		return 0, err
	}
	return rs.tool.run(ctx, "checkpoint", "--leave-running", "--compression=none", "--image-path", rs.image, rs.id)
}

// restoreN restores k new containers from the image at once (`runsc
// restore --detach`) and returns how long until all had; they are deleted
// afterwards, untimed.
func (rs *runscPeer) restoreN(ctx context.Context, k int) (time.Duration, error) {
	ids := make([]string, k)
	rs.mu.Lock()
	for i := range ids {
		rs.seq++
		ids[i] = rs.id + "r" + strconv.Itoa(rs.seq)
		rs.ids = append(rs.ids, ids[i])
	}
	rs.mu.Unlock()
	d, err := timed(func() error {
		return errors.Join(allAtOnce(k, func(i int) error {
			// Detached: its output goes to a file (a pipe would stay open).
			return rs.tool.start(ctx, "restore", "--detach", "--image-path", rs.image, "--bundle", rs.bundle, ids[i])
		})...)
	})
	for _, id := range ids {
		// A failed delete is reported only when every restore worked.
		if _, derr := rs.tool.run(context.WithoutCancel(ctx), "delete", "--force", id); derr != nil && err == nil {
			err = derr
		}
	}
	return d, err
}

// runscBundle writes an OCI bundle into dir (made by `runsc spec`): the
// host's root read-only, a tmpfs /tmp, holdMemory as the process.
func runscBundle(ctx context.Context, bin, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, bin, "spec", "--bundle", dir, "--", "/bin/sh", "-c", holdMemory)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("runsc spec: %v: %s", err, out)
	}
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return err
	}
	spec["root"] = map[string]any{"path": "/", "readonly": true}
	if p, ok := spec["process"].(map[string]any); ok {
		p["terminal"] = false
	}
	mounts, _ := spec["mounts"].([]any)
	spec["mounts"] = append(mounts, map[string]any{"destination": "/tmp", "type": "tmpfs", "source": "tmpfs"})
	if raw, err = json.Marshal(spec); err != nil {
		return err
	}
	return os.WriteFile(path, raw, 0o600)
}
