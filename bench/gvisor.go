package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/forkbox/forkbox/client"
)

// The gVisor tier's rows: exec through the agent, and memory snapshot,
// restore and fork of a sandbox with residentMB of process memory; beside
// them the runsc CLI doing the same (exec, checkpoint --leave-running,
// restore) on a container holding as much.

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
// driver; otherwise each row says why it is missing.
func (f *forkbox) measureGVisor(ctx context.Context) []Result {
	ops := []string{OpGVisorExec, OpMemSnapshot, OpMemRestore, OpMemFork}
	if !f.hasDriver(ctx, driverGVisor) {
		return failOps(ops, SystemForkbox, errors.New("the daemon has no gvisor driver (install runsc from bookworm-backports)"))
	}
	w, n, mn := f.opts.Warmup, f.opts.N, min(f.opts.N, gvisorMaxN)
	f.opts.progressf("forkbox gVisor: exec true x %d in one session", w+n)
	s, _, err := f.createWith(ctx, client.CreateRequest{Isolation: driverGVisor})
	if err != nil {
		return failOps(ops, SystemForkbox, err)
	}
	execs, err := series(ctx, w, n, func(ctx context.Context) (time.Duration, error) { return f.exec(ctx, s.ID) })
	rows := []Result{newResult(OpGVisorExec, SystemForkbox, execs, err)}

	f.opts.progressf("forkbox gVisor: hold %d MB in a process, memory snapshot x %d", residentMB, w+mn)
	err = f.holdMemory(ctx, s.ID)
	var last *client.Snapshot
	var snaps []time.Duration
	if err == nil {
		snaps, err = series(ctx, w, mn, func(ctx context.Context) (time.Duration, error) {
			if last != nil {
				if err := f.deleteSnapshot(ctx, last.ID, true); err != nil {
					return 0, err
				}
			}
			return timedCall("memory snapshot "+s.ID, func() (err error) {
				last, err = f.c.SnapshotWith(ctx, s.ID, client.SnapshotRequest{Memory: true, ExpiresInS: snapshotExpiryS})
				if err == nil {
					f.snaps[last.ID] = true
				}
				return err
			})
		})
	}
	rows = append(rows, dataRow(newResult(OpMemSnapshot, SystemForkbox, snaps, err), residentMB))
	if err != nil {
		_, _ = f.destroy(ctx, s.ID)
		return append(rows, failOps(ops[2:], SystemForkbox, err)...)
	}
	if _, err := f.destroy(ctx, s.ID); err != nil {
		return append(rows, failOps(ops[2:], SystemForkbox, err)...)
	}

	f.opts.progressf("forkbox gVisor: restore x %d, fork %d x %d", w+mn, gvisorForkCount, w+mn)
	restores, err := series(ctx, w, mn, func(ctx context.Context) (time.Duration, error) {
		r, d, err := f.createWith(ctx, client.CreateRequest{Snapshot: last.ID})
		if err != nil {
			return 0, err
		}
		_, err = f.destroy(ctx, r.ID)
		return d, err
	})
	rows = append(rows, dataRow(newResult(OpMemRestore, SystemForkbox, restores, err), residentMB))
	forks, err := series(ctx, w, mn, func(ctx context.Context) (time.Duration, error) {
		var res *client.ForkResult
		d, err := timedCall("fork "+last.ID, func() (err error) {
			res, err = f.c.ForkSnapshot(ctx, last.ID, client.ForkRequest{Count: gvisorForkCount,
				CreateRequest: client.CreateRequest{Metadata: f.labels()}})
			return err
		})
		if err != nil {
			return 0, err
		}
		for _, fs := range res.Sessions {
			f.live[fs.ID] = true
			if _, err := f.destroy(ctx, fs.ID); err != nil {
				return 0, err
			}
		}
		return d, nil
	})
	rows = append(rows, dataRow(newResult(OpMemFork, SystemForkbox, forks, err), residentMB))
	if err := f.deleteSnapshot(ctx, last.ID, true); err != nil {
		f.opts.progressf("forkbox gVisor: delete snapshot %s: %v", last.ID, err)
	}
	return rows
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

// dataRow sets a row's DataMB.
func dataRow(r Result, mb int) Result {
	r.DataMB = mb
	return r
}

// failOps returns a failed row of system for each of ops.
func failOps(ops []string, system string, err error) []Result {
	rows := make([]Result, 0, len(ops))
	for _, op := range ops {
		rows = append(rows, newResult(op, system, nil, err))
	}
	return rows
}

// measureRunsc measures the runsc CLI (systrap, no network) on a container
// whose root is the host's, read-only, with a tmpfs /tmp: exec of true, and
// checkpoint --leave-running and restore while a process holds residentMB.
// Every container and its state are removed at the end.
func measureRunsc(ctx context.Context, opts Options, versions map[string]string) []Result {
	ops := []string{OpGVisorExec, OpMemSnapshot, OpMemRestore}
	bin, err := exec.LookPath("runsc")
	if err != nil {
		return failOps(ops, SystemRunsc, errors.New("runsc is not installed"))
	}
	dir, err := os.MkdirTemp("", "forkbox-bench-runsc-*")
	if err != nil {
		return failOps(ops, SystemRunsc, err)
	}
	defer os.RemoveAll(dir)
	root := filepath.Join(dir, "state")
	rs := tool{bin: bin, pre: []string{"--root", root, "--platform=systrap", "--network=none"}, dir: dir}
	versions[SystemRunsc] = rs.version(ctx)
	bundle := filepath.Join(dir, "bundle")
	if err := runscBundle(ctx, bin, bundle); err != nil {
		return failOps(ops, SystemRunsc, err)
	}
	id := fmt.Sprintf("fbb-runsc-%d", os.Getpid())
	ids := []string{id}
	defer func() {
		for _, c := range ids {
			_, _ = rs.run(context.WithoutCancel(ctx), "delete", "--force", c)
		}
	}()
	if err := rs.start(ctx, "run", "--detach", "--bundle", bundle, id); err != nil {
		return failOps(ops, SystemRunsc, err)
	}
	w, n, mn := opts.Warmup, opts.N, min(opts.N, gvisorMaxN)
	ready := func() error {
		deadline := time.Now().Add(time.Minute)
		for time.Now().Before(deadline) {
			if _, err := rs.run(ctx, "exec", id, "test", "-f", "/tmp/ready"); err == nil {
				return nil
			}
			time.Sleep(100 * time.Millisecond)
		}
		return errors.New("runsc: the container did not fill its memory within a minute")
	}
	if err := ready(); err != nil {
		return failOps(ops, SystemRunsc, err)
	}
	opts.progressf("runsc CLI: exec true x %d, checkpoint x %d, restore x %d", w+n, w+mn, w+mn)
	execs, err := series(ctx, w, n, func(ctx context.Context) (time.Duration, error) { return rs.run(ctx, "exec", id, "true") })
	rows := []Result{newResult(OpGVisorExec, SystemRunsc, execs, err)}
	image := filepath.Join(dir, "image")
	ckpts, err := series(ctx, w, mn, func(ctx context.Context) (time.Duration, error) {
		if err := os.RemoveAll(image); err != nil {
			return 0, err
		}
		return rs.run(ctx, "checkpoint", "--leave-running", "--compression=none", "--image-path", image, id)
	})
	rows = append(rows, dataRow(newResult(OpMemSnapshot, SystemRunsc, ckpts, err), residentMB))
	if err != nil {
		return append(rows, dataRow(newResult(OpMemRestore, SystemRunsc, nil, err), residentMB))
	}
	i := 0
	restores, err := series(ctx, w, mn, func(ctx context.Context) (time.Duration, error) {
		i++
		rid := id + "r" + strconv.Itoa(i)
		ids = append(ids, rid)
		// Detached: its output goes to a file (a pipe would stay open).
		d, err := timed(func() error {
			return rs.start(ctx, "restore", "--detach", "--image-path", image, "--bundle", bundle, rid)
		})
		if err != nil {
			return 0, err
		}
		_, err = rs.run(ctx, "delete", "--force", rid)
		return d, err
	})
	return append(rows, dataRow(newResult(OpMemRestore, SystemRunsc, restores, err), residentMB))
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
