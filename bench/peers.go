package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// podmanFlags make podman 4.3 work on this kind of machine (cgroup v1
// hybrid: crun refuses limits, default ulimits are refused) and match the
// runc peer (no network).
var podmanFlags = []string{
	"--runtime", "runc",
	"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024",
	"--network", "none",
}

// peerOps are the operations measured on every peer, in table order.
var peerOps = []string{OpRun, OpExec, OpPause, OpResume}

// opsOf returns the operations measured on system: peerOps, and for
// podman also a snapshot (podman commit).
func opsOf(system string) []string {
	if system == SystemPodman {
		return append(slices.Clone(peerOps), OpSnapshot)
	}
	return peerOps
}

// withData returns r with DataMB set when it is a snapshot row.
func withData(opts Options, r Result) Result {
	if r.Operation == OpSnapshot {
		r.DataMB = opts.SnapshotMB
	}
	return r
}

// measurePeers builds a busybox root filesystem in a temporary directory
// and measures the runc CLI and podman on it, one after the other. Failures
// become error rows; the returned error is only about cleaning up.
// versions gets a line per peer.
func measurePeers(ctx context.Context, opts Options, versions map[string]string) ([]Result, error) {
	dir, err := os.MkdirTemp("", "forkbox-bench-peers-*")
	if err != nil {
		err = fmt.Errorf("peer directory: %w", err)
		return append(failAll(opts, SystemRunc, err), failAll(opts, SystemPodman, err)...), nil
	}
	rootfs := filepath.Join(dir, "rootfs")
	if err := buildRootFS(rootfs); err != nil {
		return append(failAll(opts, SystemRunc, err), failAll(opts, SystemPodman, err)...), removeTree(dir)
	}
	prefix := fmt.Sprintf("fbb-%d", os.Getpid())
	rows := measureRunc(ctx, opts, dir, rootfs, prefix, versions)
	rows = append(rows, measurePodman(ctx, opts, dir, rootfs, prefix, versions)...)
	removeCgroupParent()
	return rows, removeTree(dir)
}

// failAll returns an error row for every operation of system.
func failAll(opts Options, system string, err error) []Result {
	rows := failOps(opsOf(system), system, err)
	for i := range rows {
		rows[i] = withData(opts, rows[i])
	}
	return rows
}

// skipAll returns a skipped row for every operation of system.
func skipAll(opts Options, system, why string) []Result {
	var rows []Result
	for _, op := range opsOf(system) {
		rows = append(rows, withData(opts, skipped(op, system, why)))
	}
	return rows
}

// measureRunc measures the runc CLI with a private --root under dir:
// `runc run` of /bin/true to completion, and `runc exec`, `runc pause` and
// `runc resume` on a container running /bin/sleep.
func measureRunc(ctx context.Context, opts Options, dir, rootfs, prefix string, versions map[string]string) []Result {
	bin, err := exec.LookPath("runc")
	if err != nil {
		opts.progressf("runc: skipped (not in PATH)")
		return skipAll(opts, SystemRunc, "runc not in PATH")
	}
	runc := tool{bin: bin, pre: []string{"--root", filepath.Join(dir, "runc-root")}, dir: dir}
	versions[SystemRunc] = runc.version(ctx) + " (" + bin + "), busybox rootfs"
	trueBundle, sleepBundle := filepath.Join(dir, "bundle-true"), filepath.Join(dir, "bundle-sleep")
	if err := writeBundle(trueBundle, rootfs, prefix+"-run", []string{"/bin/true"}); err != nil {
		return failAll(opts, SystemRunc, err)
	}
	if err := writeBundle(sleepBundle, rootfs, prefix+"-sleep", []string{"/bin/sleep", "3600"}); err != nil {
		return failAll(opts, SystemRunc, err)
	}
	w, n := opts.Warmup, opts.N
	cleanup := func(id string) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_, _ = runc.run(cctx, "delete", "--force", id) // gone already when it succeeded
	}

	opts.progressf("runc: run /bin/true x %d", w+n)
	i := 0
	runs, err := series(ctx, w, n, func(ctx context.Context) (time.Duration, error) {
		i++
		id := fmt.Sprintf("%s-run-%d", prefix, i)
		d, err := runc.run(ctx, "run", "--bundle", trueBundle, id)
		if err != nil {
			cleanup(id)
		}
		return d, err
	})
	rows := []Result{newResult(OpRun, SystemRunc, runs, err)}

	id := prefix + "-sleep"
	defer cleanup(id)
	if err := runc.start(ctx, "run", "--detach", "--bundle", sleepBundle, id); err != nil {
		return append(rows, newResult(OpExec, SystemRunc, nil, err),
			newResult(OpPause, SystemRunc, nil, err), newResult(OpResume, SystemRunc, nil, err))
	}
	opts.progressf("runc: exec /bin/true x %d", w+n)
	execs, err := series(ctx, w, n, func(ctx context.Context) (time.Duration, error) {
		return runc.run(ctx, "exec", id, "/bin/true")
	})
	rows = append(rows, newResult(OpExec, SystemRunc, execs, err))

	opts.progressf("runc: pause + resume x %d", w+n)
	pauses, resumes, err := pairSeries(ctx, w, n,
		func(ctx context.Context) (time.Duration, error) { return runc.run(ctx, "pause", id) },
		func(ctx context.Context) (time.Duration, error) { return runc.run(ctx, "resume", id) })
	return append(rows, newResult(OpPause, SystemRunc, pauses, err), newResult(OpResume, SystemRunc, resumes, err))
}

// measurePodman measures podman (with runc) on the same root filesystem:
// `podman run --rm` of /bin/true to completion, and `podman exec`,
// `podman pause` and `podman unpause` on a container running /bin/sleep;
// then (once that container is gone) `podman commit` (measurePodmanCommit).
// Skipped when podman is not in PATH.
func measurePodman(ctx context.Context, opts Options, dir, rootfs, prefix string, versions map[string]string) (rows []Result) {
	bin, err := exec.LookPath("podman")
	if err != nil {
		opts.progressf("podman: skipped (not in PATH)")
		return skipAll(opts, SystemPodman, "podman not in PATH")
	}
	podman := tool{bin: bin, dir: dir}
	versions[SystemPodman] = podman.version(ctx) + " (" + bin + "), " + strings.Join(podmanFlags, " ") + " --rootfs"
	// Deferred first, so it runs last: after the sleep container is removed.
	defer func() { rows = append(rows, measurePodmanCommit(ctx, opts, podman, dir, prefix)) }()
	w, n := opts.Warmup, opts.N
	cleanup := func(name string) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_, _ = podman.run(cctx, "rm", "--force", "--ignore", "--time", "0", name)
	}
	runArgs := func(args ...string) []string { // podman run with podmanFlags, then args
		return slices.Concat([]string{"run"}, podmanFlags, args)
	}

	opts.progressf("podman: run --rm /bin/true x %d", w+n)
	i := 0
	runs, err := series(ctx, w, n, func(ctx context.Context) (time.Duration, error) {
		i++
		name := fmt.Sprintf("%s-run-%d", prefix, i)
		d, err := podman.run(ctx, runArgs("--rm", "--name", name, "--rootfs", rootfs, "/bin/true")...)
		if err != nil {
			cleanup(name)
		}
		return d, err
	})
	rows = []Result{newResult(OpRun, SystemPodman, runs, err)}

	name := prefix + "-sleep"
	defer cleanup(name)
	if err := podman.start(ctx, runArgs("--detach", "--name", name, "--rootfs", rootfs, "/bin/sleep", "3600")...); err != nil {
		return append(rows, newResult(OpExec, SystemPodman, nil, err),
			newResult(OpPause, SystemPodman, nil, err), newResult(OpResume, SystemPodman, nil, err))
	}
	opts.progressf("podman: exec /bin/true x %d", w+n)
	execs, err := series(ctx, w, n, func(ctx context.Context) (time.Duration, error) {
		return podman.run(ctx, "exec", name, "/bin/true")
	})
	rows = append(rows, newResult(OpExec, SystemPodman, execs, err))

	opts.progressf("podman: pause + unpause x %d", w+n)
	pauses, resumes, err := pairSeries(ctx, w, n,
		func(ctx context.Context) (time.Duration, error) { return podman.run(ctx, "pause", name) },
		func(ctx context.Context) (time.Duration, error) { return podman.run(ctx, "unpause", name) })
	return append(rows, newResult(OpPause, SystemPodman, pauses, err), newResult(OpResume, SystemPodman, resumes, err))
}

// tool is a command-line program run once per operation.
type tool struct {
	bin string   // absolute path of the binary
	pre []string // global flags put before every command's arguments
	dir string   // where start keeps the output of detached commands
}

// run runs the tool with args to completion and returns the wall-clock
// time from starting the process to its exit. Standard input and output
// are /dev/null; standard error is kept for the error.
func (t tool) run(ctx context.Context, args ...string) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, t.bin, slices.Concat(t.pre, args)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	d, err := timed(cmd.Run)
	if err != nil {
		return 0, t.fail(args, err, stderr.String())
	}
	return d, nil
}

// start runs a command that leaves a process behind (a detached
// container). Its output goes to a file rather than a pipe, so that
// waiting for the command does not wait for the process it leaves.
func (t tool) start(ctx context.Context, args ...string) error {
	out, err := os.CreateTemp(t.dir, "output-*")
	if err != nil {
		return fmt.Errorf("output file: %w", err)
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd := exec.CommandContext(ctx, t.bin, slices.Concat(t.pre, args)...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(out.Name())
		return t.fail(args, err, string(b))
	}
	return nil
}

// version returns the first line of `tool --version`, or "version
// unknown".
func (t tool) version(ctx context.Context) string {
	b, err := exec.CommandContext(ctx, t.bin, "--version").Output()
	line, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	if err != nil || line == "" {
		return "version unknown"
	}
	return line
}

// fail builds the error of a failed command: the command line, why it
// failed and the end of what it wrote.
func (t tool) fail(args []string, err error, output string) error {
	msg := fmt.Sprintf("%s %s", filepath.Base(t.bin), strings.Join(args, " "))
	if out := strings.TrimSpace(output); out != "" {
		return fmt.Errorf("%s: %w: %s", msg, err, oneLine(out, 300))
	}
	return fmt.Errorf("%s: %w", msg, err)
}
