package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/forkbox/forkbox/client"
)

// GroupCode is the code interpreter's rows: a cell in a warm kernel, the
// first cell after create, a matplotlib chart cell, each beside the same
// Python run as a plain `python3 -c` exec in the same kind of sandbox.
const GroupCode = "code"

// The code interpreter's operations.
const (
	// OpCodeWarm is runCode('1+1') in a warm kernel (forkbox's
	// /v1/sessions/{id}/code/execute, the whole stream), or an exec of
	// `python3 -c 'print(1+1)'`.
	OpCodeWarm = "code: runCode 1+1, warm kernel"
	// OpCodeFirst is the first runCode('1+1') after a create from the
	// code-interpreter template returned, the create taking a member of
	// that template's warm pool (whose kernel started with it); or the
	// first exec of `python3 -c 'print(1+1)'` in a new sandbox.
	OpCodeFirst = "code: first runCode after create"
	// OpCodeFirstCold is the same after a cold create (no pool member:
	// the kernel starts at create and the call waits for it).
	OpCodeFirstCold = "code: first runCode, cold create"
	// OpCodeChart is a cell that draws a line plot (PNG and chart JSON
	// come back) in a warm kernel, or an exec of python3 -c with the same
	// plot saved as a PNG.
	OpCodeChart = "code: matplotlib chart cell"
)

// SystemPythonExec is the same Python run by a forkbox exec of
// `python3 -c` (a new interpreter each time).
const SystemPythonExec = "python3 -c exec"

// chartCell draws the chart of the OpCodeChart rows.
const chartCell = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 1, 5])\nplt.title('t')\nplt.show()"

// chartScript is chartCell as a script that writes the PNG itself.
const chartScript = "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt, io\nplt.plot([1, 2, 3], [4, 1, 5])\nplt.title('t')\nplt.savefig(io.BytesIO(), format='png')"

// codeTemplate is the template the rows' sandboxes start from.
const codeTemplate = "code-interpreter-v1"

// measureCode measures the code interpreter's rows (GroupCode) in two
// sandboxes of the code-interpreter template made untimed, and a fresh one
// per round for the first-call row.
func (e *env) measureCode(ctx context.Context) []Result {
	f := e.fb
	ops := []string{OpCodeWarm, OpCodeChart}
	s, _, err := f.createWith(ctx, client.CreateRequest{Template: codeTemplate})
	if err != nil {
		return append(failOps(ops, SystemForkbox, err), failOps([]string{OpCodeFirst}, SystemForkbox, err)...)
	}
	defer f.destroy(ctx, s.ID)
	if _, err := f.runCode(ctx, s.ID, "1"); err != nil { // the kernel is up
		return append(failOps(ops, SystemForkbox, err), failOps([]string{OpCodeFirst}, SystemForkbox, err)...)
	}
	e.opts.progressf("code: runCode 1+1 and a chart cell x %d, interleaved with python3 -c execs", e.opts.Warmup+e.opts.N)
	rows := interleave(ctx, e.opts.Warmup, e.opts.N, ops, []contender{
		{system: SystemForkbox, step: func(ctx context.Context) ([]time.Duration, error) {
			a, err := f.runCode(ctx, s.ID, "1+1")
			if err != nil {
				return nil, err
			}
			b, err := f.runCode(ctx, s.ID, chartCell)
			return []time.Duration{a, b}, err
		}},
		{system: SystemPythonExec, step: func(ctx context.Context) ([]time.Duration, error) {
			a, err := f.execPython(ctx, s.ID, "print(1+1)")
			if err != nil {
				return nil, err
			}
			b, err := f.execPython(ctx, s.ID, chartScript)
			return []time.Duration{a, b}, err
		}},
	})
	// first times call in a new session of req (pool: after the pool of
	// the code template is full again).
	first := func(req client.CreateRequest, pool bool, call func(ctx context.Context, id string) (time.Duration, error)) func(ctx context.Context) ([]time.Duration, error) {
		return one(func(ctx context.Context) (time.Duration, error) {
			if pool {
				if err := f.waitPoolFull(ctx, codeTemplate); err != nil {
					return 0, err
				}
			}
			s, _, err := f.createWith(ctx, req)
			if err != nil {
				return 0, err
			}
			d, err := call(ctx, s.ID)
			if _, derr := f.destroy(ctx, s.ID); err == nil {
				err = derr
			}
			return d, err
		})
	}
	code := func(ctx context.Context, id string) (time.Duration, error) { return f.runCode(ctx, id, "1+1") }
	python := func(ctx context.Context, id string) (time.Duration, error) {
		return f.execPython(ctx, id, "print(1+1)")
	}
	e.opts.progressf("code: first runCode after a cold create x %d", e.opts.Warmup+e.opts.N)
	rows = append(rows, interleave(ctx, e.opts.Warmup, e.opts.N, []string{OpCodeFirstCold}, []contender{
		{system: SystemForkbox, step: first(client.CreateRequest{Template: codeTemplate}, false, code)},
	})...)
	pooled, err := f.codePool(ctx)
	if err != nil {
		return append(rows, failOps([]string{OpCodeFirst}, SystemForkbox, err)...)
	}
	e.opts.progressf("code: first runCode after a create from a warm pool x %d, interleaved with a first python3 -c exec", e.opts.Warmup+e.opts.N)
	rows = append(rows, interleave(ctx, e.opts.Warmup, e.opts.N, []string{OpCodeFirst}, []contender{
		{system: SystemForkbox, step: first(pooled, true, code)},
		{system: SystemPythonExec, step: first(client.CreateRequest{}, false, python)},
	})...)
	if err := f.restorePools(ctx); err != nil {
		rows = append(rows, failOps([]string{OpCodeFirst}, SystemForkbox, err)...)
	}
	// A member still starting is torn down when it is ready: wait for it,
	// so that the next group (the idle figures) does not see it go.
	if err := f.waitPoolEmpty(ctx, codeTemplate); err != nil {
		rows = append(rows, failOps([]string{OpCodeFirst}, SystemForkbox, err)...)
	}
	return rows
}

// codePool sets a warm pool of one member of the code-interpreter template
// (with the create defaults) and returns the create that takes it.
func (f *forkbox) codePool(ctx context.Context) (client.CreateRequest, error) {
	info, err := f.c.Info(ctx)
	if err != nil {
		return client.CreateRequest{}, fmt.Errorf("info: %w", err)
	}
	l := info.Limits
	p := client.Pool{Template: codeTemplate, Size: 1, CPU: l.DefaultCPU, MemoryMB: l.DefaultMemoryMB, Pids: l.DefaultPids, DiskMB: l.DefaultDiskMB}
	if err := f.setPool(ctx, p); err != nil {
		return client.CreateRequest{}, err
	}
	return client.CreateRequest{Template: codeTemplate, CPU: p.CPU, MemoryMB: p.MemoryMB, Pids: p.Pids, DiskMB: p.DiskMB}, nil
}

// runCode runs code in session id's default Python context and returns how
// long the whole stream took. A cell that raised is an error.
func (f *forkbox) runCode(ctx context.Context, id, code string) (time.Duration, error) {
	var ex *client.Execution
	d, err := timed(func() (err error) {
		ex, err = f.c.RunCode(ctx, id, client.CodeRequest{Code: code}, nil)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("run code in %s: %w", id, err)
	}
	if ex.Error != nil {
		return 0, fmt.Errorf("run code in %s: %s: %s", id, ex.Error.Name, ex.Error.Value)
	}
	return d, nil
}

// execPython runs `python3 -c script` in session id and returns how long
// the round trip took.
func (f *forkbox) execPython(ctx context.Context, id, script string) (time.Duration, error) {
	var out *client.ExecOutput
	d, err := timed(func() (err error) {
		out, err = f.c.ExecCollect(ctx, id, client.ExecRequest{Argv: []string{"python3", "-c", script}})
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("exec python3 in %s: %w", id, err)
	}
	if out.ExitCode != 0 {
		return 0, fmt.Errorf("exec python3 in %s: exit code %d (stderr %q)", id, out.ExitCode, out.Stderr)
	}
	return d, nil
}
