package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
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

// maxStartSlots is how many runc containers the peer starts at once at
// most (the largest fork row).
const maxStartSlots = 64

// peers are the systems measured beside forkbox: the runc CLI and podman
// (with runc) on a busybox root filesystem, and the runsc CLI. A peer that
// is not installed or could not be set up is nil, with the reason in
// why. Long-lived containers (a sleeper per tool) are started on first
// use and removed by close. Its methods may be called from several
// goroutines.
type peers struct {
	opts   Options
	dir    string // temporary directory holding everything below
	rootfs string // the busybox root filesystem
	prefix string // of every container name, unique to the run

	runc, podman *tool
	why          map[string]string // system -> why it is not measured
	versions     map[string]string // the report's, for peers set up later (runsc)

	// runc bundles: /bin/true to completion and /bin/sleep, one per slot
	// (each with its own cgroup) so that slots can run at once.
	trueBundles, sleepBundles []string

	mu            sync.Mutex
	runcSleeper   string   // runc container running /bin/sleep; "" before
	podmanSleeper string   // podman container running /bin/sleep; "" before
	seq           int      // counter for unique container names
	leftRunc      []string // runc containers that may still exist
	leftPodman    []string // podman containers that may still exist
}

// openPeers finds runc and podman and builds their root filesystem and
// bundles in a temporary directory. It does not fail: a peer that cannot
// be used is left nil and why says why. versions gets a line per peer.
func openPeers(opts Options, versions map[string]string) *peers {
	p := &peers{opts: opts, why: map[string]string{}, versions: versions, prefix: fmt.Sprintf("fbb-%d", os.Getpid())}
	fail := func(err error) *peers {
		p.why[SystemRunc], p.why[SystemPodman] = err.Error(), err.Error()
		p.runc, p.podman = nil, nil
		return p
	}
	dir, err := os.MkdirTemp("", "forkbox-bench-peers-*")
	if err != nil {
		return fail(fmt.Errorf("peer directory: %w", err))
	}
	p.dir, p.rootfs = dir, filepath.Join(dir, "rootfs")
	if err := buildRootFS(p.rootfs); err != nil {
		return fail(err)
	}
	ctx := context.Background()
	if bin, err := exec.LookPath("runc"); err != nil {
		p.why[SystemRunc] = "runc not in PATH"
	} else {
		p.runc = &tool{bin: bin, pre: []string{"--root", filepath.Join(dir, "runc-root")}, dir: dir}
		versions[SystemRunc] = p.runc.version(ctx) + " (" + bin + "), busybox rootfs"
		if err := p.writeBundles(); err != nil {
			p.why[SystemRunc], p.runc = err.Error(), nil
		}
	}
	if bin, err := exec.LookPath("podman"); err != nil {
		p.why[SystemPodman] = "podman not in PATH"
	} else {
		p.podman = &tool{bin: bin, dir: dir}
		versions[SystemPodman] = p.podman.version(ctx) + " (" + bin + "), " + strings.Join(podmanFlags, " ") + " --rootfs"
	}
	return p
}

// writeBundles writes the runc bundles of every slot.
func (p *peers) writeBundles() error {
	for i := range maxStartSlots {
		tb, sb := filepath.Join(p.dir, fmt.Sprintf("bundle-true-%d", i)), filepath.Join(p.dir, fmt.Sprintf("bundle-sleep-%d", i))
		if err := writeBundle(tb, p.rootfs, fmt.Sprintf("%s-run-%d", p.prefix, i), []string{"/bin/true"}); err != nil {
			return err
		}
		if err := writeBundle(sb, p.rootfs, fmt.Sprintf("%s-sleep-%d", p.prefix, i), []string{"/bin/sleep", "3600"}); err != nil {
			return err
		}
		p.trueBundles, p.sleepBundles = append(p.trueBundles, tb), append(p.sleepBundles, sb)
	}
	return nil
}

// name returns a container name unique to the run, with kind in it.
func (p *peers) name(kind string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	return fmt.Sprintf("%s-%s-%d", p.prefix, kind, p.seq)
}

// remember records a container that close removes if it still exists.
func (p *peers) remember(list *[]string, name string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	*list = append(*list, name)
}

// missing returns a contender list entry's reason for system being
// absent, or "" when it can be measured.
func (p *peers) missing(system string) string {
	if p == nil {
		return "peers skipped"
	}
	switch system {
	case SystemRunc:
		if p.runc != nil {
			return ""
		}
	case SystemPodman:
		if p.podman != nil {
			return ""
		}
	}
	return p.why[system]
}

// runcRun is `runc run` of /bin/true to completion in slot's bundle.
func (p *peers) runcRun(ctx context.Context, slot int) (time.Duration, error) {
	id := p.name("run")
	d, err := p.runc.run(ctx, "run", "--bundle", p.trueBundles[slot], id)
	if err != nil {
		p.runcDelete(ctx, id)
	}
	return d, err
}

// runcDelete force-deletes runc container id (no error when it is gone),
// even after ctx is cancelled.
func (p *peers) runcDelete(ctx context.Context, id string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_, _ = p.runc.run(cctx, "delete", "--force", id)
}

// runcStartN starts k runc containers running /bin/sleep at once (slots
// 0..k-1) and returns how long it took until every one of them had
// answered a `runc exec /bin/true`; they are deleted afterwards, untimed.
func (p *peers) runcStartN(ctx context.Context, k int) (time.Duration, error) {
	ids := make([]string, k)
	for i := range ids {
		ids[i] = p.name("start")
		p.remember(&p.leftRunc, ids[i])
	}
	defer allAtOnce(k, func(i int) error { p.runcDelete(ctx, ids[i]); return nil })
	return timed(func() error {
		return errors.Join(allAtOnce(k, func(i int) error {
			if err := p.runc.start(ctx, "run", "--detach", "--bundle", p.sleepBundles[i], ids[i]); err != nil {
				return err
			}
			_, err := p.runc.run(ctx, "exec", ids[i], "/bin/true")
			return err
		})...)
	})
}

// allAtOnce calls f(0) ... f(n-1), each in a goroutine of its own, waits
// for all of them, and returns their errors by index.
func allAtOnce(n int, f func(i int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = f(i) }()
	}
	wg.Wait()
	return errs
}

// runcSleeping returns the run's runc container running /bin/sleep,
// starting it on first use (slot 0's bundle).
func (p *peers) runcSleeping(ctx context.Context) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.runcSleeper != "" {
		return p.runcSleeper, nil
	}
	id := p.prefix + "-sleeper"
	p.leftRunc = append(p.leftRunc, id)
	if err := p.runc.start(ctx, "run", "--detach", "--bundle", p.sleepBundles[0], id); err != nil {
		return "", err
	}
	p.runcSleeper = id
	return id, nil
}

// podmanRunArgs returns `podman run` with podmanFlags, then args.
func podmanRunArgs(args ...string) []string {
	return slices.Concat([]string{"run"}, podmanFlags, args)
}

// podmanRemove force-removes podman container name (no error when it is
// gone), even after ctx is cancelled.
func (p *peers) podmanRemove(ctx context.Context, name string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_, _ = p.podman.run(cctx, "rm", "--force", "--ignore", "--time", "0", name)
}

// podmanRun is `podman run --rm` of /bin/true to completion.
func (p *peers) podmanRun(ctx context.Context) (time.Duration, error) {
	name := p.name("prun")
	d, err := p.podman.run(ctx, podmanRunArgs("--rm", "--name", name, "--rootfs", p.rootfs, "/bin/true")...)
	if err != nil {
		p.podmanRemove(ctx, name)
	}
	return d, err
}

// podmanSleeping returns the run's podman container running /bin/sleep,
// starting it on first use.
func (p *peers) podmanSleeping(ctx context.Context) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.podmanSleeper != "" {
		return p.podmanSleeper, nil
	}
	name := p.prefix + "-psleeper"
	p.leftPodman = append(p.leftPodman, name)
	if err := p.podman.start(ctx, podmanRunArgs("--detach", "--name", name, "--rootfs", p.rootfs, "/bin/sleep", "3600")...); err != nil {
		return "", err
	}
	p.podmanSleeper = name
	return name, nil
}

// close removes every container the peers made, the cgroups runc leaves
// and the temporary directory, even after ctx is cancelled.
func (p *peers) close(ctx context.Context) error {
	if p == nil || p.dir == "" {
		return nil
	}
	if p.runc != nil {
		for _, id := range p.leftRunc {
			p.runcDelete(ctx, id)
		}
	}
	if p.podman != nil {
		for _, name := range p.leftPodman {
			p.podmanRemove(ctx, name)
		}
	}
	removeCgroupParent()
	return removeTree(p.dir)
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
