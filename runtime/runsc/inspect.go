package runsc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"

	gorunc "github.com/containerd/go-runc"
	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/runtime"
)

// StopCause tells why sandbox id stopped by itself: StopPidsLimit when its
// host cgroup's pids limit refused a task (the Sentry cannot go on after
// that), StopMemoryLimit when the kernel killed one of its processes at
// the memory limit, else StopUnknown. It must be called before Delete
// removes the cgroups.
func (d *Driver) StopCause(ctx context.Context, id string) runtime.StopCause {
	if n, err := d.cg.PidsLimitHits(id); err == nil && n > 0 {
		return runtime.StopPidsLimit
	}
	if n, err := d.cg.OOMKills(id); err == nil && n > 0 {
		return runtime.StopMemoryLimit
	}
	return runtime.StopUnknown
}

var _ runtime.StopExplainer = (*Driver)(nil)

// startScale is how much longer than a runc sandbox a gVisor sandbox may
// take to start: runsc boots the Sentry, the gofer and the agent (about
// 1 s here, against 0.1 s for runc), and a restore reads a whole
// checkpoint.
const startScale = 3

// StartScale returns startScale (runtime.StartScaler).
func (d *Driver) StartScale() float64 { return startScale }

var _ runtime.StartScaler = (*Driver)(nil)

// Status maps runsc state.
func (d *Driver) Status(ctx context.Context, id string) (runtime.Status, error) {
	c, err := d.runsc.State(ctx, id)
	if err != nil {
		if notExist(err) {
			return runtime.StatusUnknown, nil
		}
		return runtime.StatusUnknown, err
	}
	// runsc keeps reporting a sandbox whose Sentry died (an OOM kill) as
	// it last saw it: its process must still be there.
	if c.Pid <= 0 || unix.Kill(c.Pid, 0) == unix.ESRCH {
		return runtime.StatusStopped, nil
	}
	switch c.Status {
	case "running":
		return runtime.StatusRunning, nil
	case "paused":
		return runtime.StatusPaused, nil
	}
	return runtime.StatusStopped, nil
}

// List returns runsc's containers.
func (d *Driver) List(ctx context.Context) ([]string, error) {
	cs, err := d.runsc.List(ctx)
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(cs))
	for _, c := range cs {
		ids = append(ids, c.ID)
	}
	return ids, nil
}

// Stats reads runsc's one-shot event statistics (runsc events --stats).
// Its output is read whole before the process is waited for: go-runc's
// Stats waits for it in another goroutine, which closes the pipe under
// the JSON decoder when runsc exits first ("read |0: file already
// closed").
func (d *Driver) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	if !runtime.ValidID(id) {
		return runtime.Stats{}, errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	raw, err := d.command(ctx, "events", "--stats", id).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && notExist(errors.New(string(ee.Stderr))) {
			return runtime.Stats{}, errdefs.Newf(errdefs.ErrNotFound, "sandbox %s", id)
		}
		if errors.As(err, &ee) {
			return runtime.Stats{}, fmt.Errorf("runsc events %s: %w: %s", id, err, summary(ee.Stderr))
		}
		return runtime.Stats{}, fmt.Errorf("runsc events %s: %w", id, err)
	}
	var ev gorunc.Event
	if err := json.Unmarshal(raw, &ev); err != nil || ev.Stats == nil {
		return runtime.Stats{}, fmt.Errorf("runsc events %s: unreadable output %q: %v", id, summary(raw), err)
	}
	st := ev.Stats
	out := runtime.Stats{}
	if st.Cpu.Usage.Total > 0 {
		out.CPUSeconds = float64(st.Cpu.Usage.Total) / 1e9
	}
	out.MemoryBytes = int64(st.Memory.Usage.Usage)
	out.MemoryPeakBytes = int64(st.Memory.Usage.Max)
	out.Pids = int64(st.Pids.Current)
	return out, nil
}

var _ runtime.Sampler = (*Driver)(nil)

// Sample reads the sandbox's host cgroups for the host monitor
// (runtime.Sampler) instead of asking runsc, which would start a runsc
// process per sandbox per round (about 50 ms each on an idle 2-core
// host, seconds on a loaded one); runsc is asked once per sandbox, for
// its Sentry's pid. CPUSeconds is then the host CPU of the
// whole sandbox, the Sentry and gofer included (what its CPU quota caps);
// Pids and PidsLimit are the host tasks of the sandbox and their limit,
// which has headroom for the runtime's own threads. A sandbox whose
// Sentry is gone (killed over its memory) is ErrNotFound, as for Stats.
func (d *Driver) Sample(ctx context.Context, id string) (runtime.Stats, error) {
	if !runtime.ValidID(id) {
		return runtime.Stats{}, errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	if !d.sentryAlive(ctx, id) {
		return runtime.Stats{}, errdefs.Newf(errdefs.ErrNotFound, "sandbox %s: its Sentry is not running", id)
	}
	return d.cg.Sample(id)
}

// Processes lists the sandbox's processes as the Sentry sees them
// (runsc ps --format=json): in-sandbox pids and command names, no command
// lines. ErrNotFound for an unknown sandbox.
func (d *Driver) Processes(ctx context.Context, id string) ([]runtime.Process, error) {
	if !runtime.ValidID(id) {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	out, err := d.command(ctx, "ps", "--format=json", id).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && notExist(errors.New(string(ee.Stderr))) {
			return nil, errdefs.Newf(errdefs.ErrNotFound, "sandbox %s", id)
		}
		return nil, fmt.Errorf("runsc ps %s: %w", id, err)
	}
	var ps []struct {
		PID int    `json:"pid"`
		Cmd string `json:"cmd"`
	}
	if err := json.Unmarshal(out, &ps); err != nil {
		return nil, fmt.Errorf("runsc ps %s: %w", id, err)
	}
	procs := make([]runtime.Process, 0, len(ps))
	for _, p := range ps {
		procs = append(procs, runtime.Process{Pid: p.PID, Name: p.Cmd})
	}
	return procs, nil
}
