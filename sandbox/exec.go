package sandbox

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
)

// Commands owns what runs in a session: exec (with its staged inputs and
// its timeout, enforced from the host), attach, the process list,
// signals and stdin, and the envd proxy's hold on the agent (token check,
// connection, health). It is safe for concurrent use.
type Commands struct{ agentCalls }

// agentGrace is added to the agent-side deadline so that the daemon's
// own kill (from outside the sandbox) always comes first.
const agentGrace = 2 * time.Second

// shellPath runs shell-form commands.
const shellPath = "/bin/sh"

// normalizeExec checks req and fills in its defaults. script tells that
// the command text is staged (so neither argv nor cmd is set).
func normalizeExec(r *node.ExecSpec, maxTimeoutS int64, defaultUser string, script bool) error {
	switch {
	case script && (len(r.Argv) > 0 || r.Cmd != ""):
		return errdefs.InvalidField("cmd", "give either argv or cmd, not both")
	case len(r.Argv) > 0 && r.Cmd != "":
		return errdefs.InvalidField("argv", "give either argv or cmd, not both")
	case len(r.Argv) == 0 && r.Cmd == "" && !script:
		return errdefs.InvalidField("cmd", "give argv or cmd")
	case len(r.Argv) > 0 && r.Argv[0] == "":
		return errdefs.InvalidField("argv", "argv[0] is empty")
	}
	for i, a := range r.Argv {
		if strings.ContainsRune(a, 0) {
			return errdefs.InvalidField("argv", "argv[%d] contains a NUL byte", i)
		}
	}
	if strings.ContainsRune(r.Cmd, 0) {
		return errdefs.InvalidField("cmd", "contains a NUL byte")
	}
	if err := validateEnv("env", r.Env); err != nil {
		return err
	}
	if strings.ContainsRune(r.Cwd, 0) {
		return errdefs.InvalidField("cwd", "contains a NUL byte")
	}
	if r.User == "" {
		r.User = defaultUser
	}
	if err := ValidateUser("user", r.User); err != nil {
		return err
	}
	if r.TimeoutS == 0 && !r.Background {
		r.TimeoutS = defaults.ExecTimeoutS
	}
	if r.TimeoutS < 0 || r.TimeoutS > maxTimeoutS {
		return errdefs.InvalidField("timeout_s", "must be between 1 and %d seconds", maxTimeoutS)
	}
	if len(r.Tag) > 128 {
		return errdefs.InvalidField("tag", "longer than 128 bytes")
	}
	return nil
}

// Exec runs req in session id and streams its output to out. It returns
// when the command's main process exits (a background child that keeps the
// output open does not hold it), or at once after the start for a
// background command. The exec timeout is enforced from the host: the
// command's process group is killed with SIGKILL through the runtime, which
// nothing in the sandbox can block. If ctx ends first, a foreground command
// is killed the same way. A command whose timeout fired while its session
// was paused (its processes are then killed as soon as they run again)
// ends timed out at once. A memory snapshot that cuts the output stream
// ends it with a typed ErrUnavailable (node.ProblemExecStreamCut) naming the
// pid to re-attach to.
func (cs *Commands) Exec(ctx context.Context, id string, req node.ExecSpec, out node.Output) (*node.ExecResult, error) {
	p, err := cs.prepareExec(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	defer p.Close()
	return p.Exec(ctx, req, node.ExecInputs{}, out)
}

// streamCut is the error of a stream of command pid that a memory
// snapshot of session id cut.
func streamCut(id string, pid int) error {
	return errdefs.Typed(errdefs.ErrUnavailable, node.ProblemExecStreamCut,
		"a memory snapshot of session %s cut this command's output stream; the command keeps running as pid %d: "+
			"GET /v1/sessions/%s/processes/%d/stream re-attaches to its output from now on and its exit", id, pid, id, pid)
}

func (cs *Commands) exec(ctx context.Context, p *ExecPrep, req node.ExecSpec, staged node.ExecInputs, out node.Output) (*node.ExecResult, error) {
	sb, id := p.sb, p.sb.id
	rec := sb.Record()
	if err := normalizeExec(&req, cs.m.opts.Limits.MaxTimeoutS, rec.DefaultUser, staged.Script != nil); err != nil {
		return nil, err
	}
	o := guest.StartOpts{Env: req.Env, Cwd: req.Cwd, User: req.User, Tag: req.Tag,
		Stdin: len(req.Stdin) > 0 || req.KeepStdin || staged.Stdin != nil}
	switch {
	case staged.Script != nil:
		o.Cmd, o.Script = shellPath, staged.Script.ID // the agent adds the staged script as its operand
	case req.Cmd != "":
		o.Cmd, o.Args = shellPath, []string{"-c", req.Cmd}
	default:
		o.Cmd, o.Args = req.Argv[0], req.Argv[1:]
	}
	if staged.Stdin != nil {
		o.StdinStage, o.KeepStdin = staged.Stdin.ID, req.KeepStdin
	}
	commandField := "argv"
	if req.Cmd != "" {
		commandField = "cmd"
	}
	// The OOM-kill count before and after tells a process the kernel killed
	// for memory; where going over the limit stops the whole sandbox
	// (gVisor), there is no such process, and reading it costs a runtime
	// call per exec.
	drv := cs.m.runtimes.driverOf(sb)
	processOOM := !drv.Capabilities().SandboxOOM
	var before int64
	if processOOM {
		before, _ = oomKills(ctx, drv, id)
	}

	// The stream's context: the agent gets a deadline slightly after ours.
	// It is not the caller's: a caller that goes away before the start
	// event would leave a command running that nobody knows the pid of (a
	// background command's stream is dropped after the start event anyway).
	// A foreground stream follows the caller's context once the pid is known.
	parent := context.WithoutCancel(ctx)
	var streamCtx context.Context
	var cancel context.CancelFunc
	if req.TimeoutS > 0 {
		streamCtx, cancel = context.WithTimeout(parent, time.Duration(req.TimeoutS)*time.Second+agentGrace)
	} else {
		streamCtx, cancel = context.WithCancel(parent)
	}
	defer cancel()
	collector, collect := out.(node.Collector)
	if collect && !req.Background {
		o.Collect = collector.CollectLimit()
	}
	cuts := sb.streamCuts.Load()
	began := time.Now()
	if err := sb.starts.enter(ctx); err != nil {
		return nil, err
	}
	if st := sb.Record().State; st != node.StateRunning {
		sb.starts.leave()
		return nil, errdefs.Newf(errdefs.ErrConflict, "session %s is %s; resume it first (POST /v1/sessions/%s/resume)", id, st, id)
	}
	stream, err := sb.agent.Start(streamCtx, o)
	sb.starts.leave()
	p.taken(staged.Script, staged.Stdin)
	if err != nil {
		return nil, cs.agentError(ctx, id, err, guest.StartField(err, commandField))
	}
	defer stream.Close()
	pid := stream.Pid()
	res := &node.ExecResult{Pid: pid}
	var timedOut atomic.Bool
	if req.TimeoutS > 0 {
		cs.armKiller(sb, pid, time.Duration(req.TimeoutS)*time.Second, &timedOut)
	}
	if !req.Background {
		if ctx.Err() != nil {
			// The caller left while the command started.
			cs.killGroup(sb, pid)
			cs.disarmKiller(sb, pid)
			return nil, ctx.Err()
		}
		stop := context.AfterFunc(ctx, cancel)
		defer stop()
	}
	if err := out.Started(pid); err != nil {
		cs.killGroup(sb, pid)
		return nil, err
	}
	if len(req.Stdin) > 0 {
		fed := make(chan struct{})
		if req.KeepStdin {
			// SendStdin calls wait for this, so that the input stays in order.
			sb.mu.Lock()
			sb.feeding[pid] = fed
			sb.mu.Unlock()
		}
		go func() {
			defer func() {
				sb.mu.Lock()
				if sb.feeding[pid] == fed {
					delete(sb.feeding, pid)
				}
				sb.mu.Unlock()
				close(fed)
			}()
			cs.feedStdin(sb, pid, req.Stdin, !req.KeepStdin)
		}()
	}
	if req.Background {
		return res, nil
	}
	defer cs.disarmKiller(sb, pid)

	end, err := stream.Follow(out)
	if err != nil {
		switch {
		case ctx.Err() != nil || errors.Is(err, guest.ErrOutput):
			cs.killGroup(sb, pid)
		case timedOut.Load() && (errors.Is(streamCtx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded)):
			// The kill went out at the timeout but the agent reported no
			// end within its grace: the sandbox is frozen (paused), and
			// its processes die of the pending SIGKILL when they run again.
			// (On a loaded host the stream's deadline error can arrive a
			// moment before the context reports it, or come from the
			// agent's side of the same deadline: either is this case.)
			cs.m.log.Info("exec timed out in a frozen sandbox", "session", id, "pid", pid)
			res.TimedOut, res.Signal, res.ExitCode = true, int(syscall.SIGKILL), 128+int(syscall.SIGKILL)
			res.DurationMS = time.Since(began).Milliseconds()
			if collect {
				collector.Truncated(false, false)
			}
			return res, nil
		case sb.streamCuts.Load() != cuts:
			return nil, streamCut(id, pid)
		}
		return nil, cs.agentError(ctx, id, err, "")
	}
	res.DurationMS = time.Since(began).Milliseconds()
	res.ExitCode, res.Signal = end.Code, end.Signal
	// The agent ends the stream right after the end event; its trailer
	// carries the command's CPU time (and what collected output was cut).
	tr := stream.Finish()
	res.CPUMS = tr.CPUMS
	if collect {
		collector.Truncated(tr.TruncatedStdout, tr.TruncatedStderr)
	}
	res.TimedOut = timedOut.Load()
	if processOOM && res.Signal == int(syscall.SIGKILL) && !res.TimedOut {
		if after, err := oomKills(ctx, drv, id); err == nil && after > before {
			res.OOMKilled = true
		}
	}
	return res, nil
}

// oomKills returns sandbox id's out-of-memory kills so far: with one file
// read where drv is a runtime.OOMCounter, else from a whole Stats reading.
func oomKills(ctx context.Context, drv runtime.Driver, id string) (int64, error) {
	if c, ok := drv.(runtime.OOMCounter); ok {
		return c.OOMKills(ctx, id)
	}
	st, err := drv.Stats(ctx, id)
	return st.OOMKills, err
}

// armKiller kills pid's process group after d and sets flag.
func (cs *Commands) armKiller(sb *Sandbox, pid int, d time.Duration, flag *atomic.Bool) {
	t := time.AfterFunc(d, func() {
		flag.Store(true)
		cs.killGroup(sb, pid)
		cs.disarmKiller(sb, pid)
	})
	sb.mu.Lock()
	if old := sb.killers[pid]; old != nil {
		old.Stop()
	}
	sb.killers[pid] = t
	sb.mu.Unlock()
}

func (cs *Commands) disarmKiller(sb *Sandbox, pid int) {
	sb.mu.Lock()
	if t := sb.killers[pid]; t != nil {
		t.Stop()
		delete(sb.killers, pid)
	}
	sb.mu.Unlock()
}

// killGroup SIGKILLs the process group pid from the host.
func (cs *Commands) killGroup(sb *Sandbox, pid int) {
	// Not in the middle of a pause or a snapshot: a driver may have to
	// thaw the sandbox for the kill (gVisor), which would let processes
	// run while a snapshot captures them.
	sb.lifeMu.Lock()
	defer sb.lifeMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	n, err := cs.m.runtimes.driverOf(sb).KillProcessGroup(ctx, sb.id, pid, int(syscall.SIGKILL))
	if err != nil {
		cs.m.log.Warn("kill process group", "session", sb.id, "pgid", pid, "err", err)
	} else {
		cs.m.log.Debug("killed process group", "session", sb.id, "pgid", pid, "processes", n)
	}
}

// feedStdin writes data to pid's stdin in chunks and then, with
// closeAfter, closes it (a KeepStdin command's stdin stays open).
func (cs *Commands) feedStdin(sb *Sandbox, pid int, data []byte, closeAfter bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := cs.writeStdin(ctx, sb, pid, data, closeAfter); err != nil {
		cs.m.log.Debug("stdin", "session", sb.id, "pid", pid, "err", err)
	}
}

func (cs *Commands) writeStdin(ctx context.Context, sb *Sandbox, pid int, data []byte, closeAfter bool) error {
	return sb.agent.WriteStdin(ctx, pid, data, closeAfter)
}
