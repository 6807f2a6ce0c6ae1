package sandbox

import (
	"context"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/node"
)

// ProcessList lists the commands still running in session id.
func (cs *Commands) ProcessList(ctx context.Context, id string) ([]node.Process, error) {
	sb, release, err := cs.m.use(ctx, id)
	if err != nil {
		return nil, err
	}
	defer release()
	out, err := sb.agent.List(ctx)
	if err != nil {
		return nil, cs.agentError(ctx, id, err, "")
	}
	return out, nil
}

// Attach re-attaches to running command pid: its output from now on goes
// to out (collected, when out is a node.Collector), and the result comes when
// it ends, with the command's whole run time and CPU time as the agent
// measured them. Leaving (ctx ends) does not stop the command. ErrNotFound
// when no such command runs or ran recently.
func (cs *Commands) Attach(ctx context.Context, id string, pid int, out node.Output) (*node.ExecResult, error) {
	sb, release, err := cs.m.use(ctx, id)
	if err != nil {
		return nil, err
	}
	defer release()
	collector, collect := out.(node.Collector)
	var limit int64
	if collect {
		limit = collector.CollectLimit()
	}
	cuts := sb.streamCuts.Load()
	stream, err := sb.agent.Connect(ctx, pid, limit)
	if err != nil {
		return nil, cs.agentError(ctx, id, err, "")
	}
	defer stream.Close()
	if err := out.Started(pid); err != nil {
		return nil, err
	}
	began := time.Now()
	end, err := stream.Follow(out)
	if err != nil {
		if ctx.Err() == nil && sb.streamCuts.Load() != cuts {
			return nil, streamCut(id, pid)
		}
		return nil, cs.agentError(ctx, id, err, "")
	}
	res := &node.ExecResult{Pid: pid, DurationMS: time.Since(began).Milliseconds(), ExitCode: end.Code, Signal: end.Signal}
	tr := stream.Finish()
	if tr.HasDuration {
		res.DurationMS = tr.DurationMS
	}
	res.CPUMS = tr.CPUMS
	if collect {
		collector.Truncated(tr.TruncatedStdout, tr.TruncatedStderr)
	}
	return res, nil
}

// Signal sends SIGTERM or SIGKILL (by number, 15 or 9) to command pid's
// process group. ErrNotFound when it is not running.
func (cs *Commands) Signal(ctx context.Context, id string, pid int, sig int) error {
	sb, release, err := cs.m.use(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	if err := sb.agent.Signal(ctx, pid, syscall.Signal(sig)); err != nil {
		return cs.agentError(ctx, id, err, "")
	}
	if sig == 9 {
		// Make sure from outside too: the agent's kill could be raced by a
		// process that keeps forking.
		cs.killGroup(sb, pid)
		cs.disarmKiller(sb, pid)
	}
	return nil
}

// SendStdin writes data to command pid's stdin and, with closeAfter,
// closes it. The command must have been started with KeepStdin.
func (cs *Commands) SendStdin(ctx context.Context, id string, pid int, data []byte, closeAfter bool) error {
	p, err := cs.prepareExec(ctx, id, int64(len(data)))
	if err != nil {
		return err
	}
	defer p.Close()
	return p.SendStdin(ctx, pid, data, nil, closeAfter)
}

func (cs *Commands) sendStdin(ctx context.Context, p *ExecPrep, pid int, data []byte, staged *node.Staged, closeAfter bool) error {
	sb := p.sb
	sb.mu.Lock()
	fed := sb.feeding[pid]
	sb.mu.Unlock()
	if fed != nil {
		// The exec's own stdin data goes first.
		select {
		case <-fed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if staged != nil {
		err := sb.agent.WriteStaged(ctx, pid, staged.ID)
		p.taken(staged)
		if err != nil {
			return cs.agentError(ctx, sb.id, err, "")
		}
	}
	if err := cs.writeStdin(ctx, sb, pid, data, closeAfter); err != nil {
		return cs.agentError(ctx, sb.id, err, "")
	}
	return nil
}
