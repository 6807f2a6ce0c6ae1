package sandbox

import (
	"context"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/internal/envdpb/processpb"
	"github.com/forkbox/forkbox/node"
)

// ProcessList lists the commands still running in session id.
func (m *Manager) ProcessList(ctx context.Context, id string) ([]node.Process, error) {
	sb, release, err := m.use(ctx, id)
	if err != nil {
		return nil, err
	}
	defer release()
	resp, err := sb.agent.process.List(ctx, connect.NewRequest(&processpb.ListRequest{}))
	if err != nil {
		return nil, m.agentError(ctx, id, err, "")
	}
	out := make([]node.Process, 0, len(resp.Msg.GetProcesses()))
	for _, p := range resp.Msg.GetProcesses() {
		out = append(out, node.Process{
			Pid: int(p.GetPid()), Tag: p.GetTag(), Cmd: p.GetConfig().GetCmd(),
			Args: p.GetConfig().GetArgs(), Env: p.GetConfig().GetEnvs(), Cwd: p.GetConfig().GetCwd(),
		})
	}
	return out, nil
}

// Attach re-attaches to running command pid: its output from now on goes
// to out (collected, when out is a node.Collector), and the result comes when
// it ends, with the command's whole run time and CPU time as the agent
// measured them. Leaving (ctx ends) does not stop the command. ErrNotFound
// when no such command runs or ran recently.
func (m *Manager) Attach(ctx context.Context, id string, pid int, out node.Output) (*node.ExecResult, error) {
	sb, release, err := m.use(ctx, id)
	if err != nil {
		return nil, err
	}
	defer release()
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: uint32(pid)}}
	creq := connect.NewRequest(&processpb.ConnectRequest{Process: sel})
	collector, collect := out.(node.Collector)
	if collect {
		creq.Header().Set(wire.CollectHeader, strconv.FormatInt(collector.CollectLimit(), 10))
	}
	cuts := sb.streamCuts.Load()
	stream, err := sb.agent.process.Connect(ctx, creq)
	if err != nil {
		return nil, m.agentError(ctx, id, err, "")
	}
	defer stream.Close()
	if !stream.Receive() {
		return nil, m.agentError(ctx, id, streamErr(stream.Err()), "")
	}
	if err := out.Started(pid); err != nil {
		return nil, err
	}
	began := time.Now()
	end, err := m.follow(ctx, stream.Receive, func() *processpb.ProcessEvent { return stream.Msg().GetEvent() }, stream.Err, out)
	if err != nil {
		if ctx.Err() == nil && sb.streamCuts.Load() != cuts {
			return nil, streamCut(id, pid)
		}
		return nil, m.agentError(ctx, id, err, "")
	}
	res := &node.ExecResult{Pid: pid, DurationMS: time.Since(began).Milliseconds()}
	fillResult(res, end)
	for stream.Receive() {
	}
	trailer := stream.ResponseTrailer()
	if ms, err := strconv.ParseInt(trailer.Get(wire.DurationTrailer), 10, 64); err == nil {
		res.DurationMS = ms
	}
	res.CPUMS, _ = strconv.ParseInt(trailer.Get(wire.CPUTrailer), 10, 64)
	if collect {
		cut := trailer.Get(wire.TruncatedTrailer)
		collector.Truncated(strings.Contains(cut, "stdout"), strings.Contains(cut, "stderr"))
	}
	return res, nil
}

// Signal sends SIGTERM or SIGKILL (by number, 15 or 9) to command pid's
// process group. ErrNotFound when it is not running.
func (m *Manager) Signal(ctx context.Context, id string, pid int, sig int) error {
	sb, release, err := m.use(ctx, id)
	if err != nil {
		return err
	}
	defer release()
	var s processpb.Signal
	switch sig {
	case 9:
		s = processpb.Signal_SIGNAL_SIGKILL
	case 15:
		s = processpb.Signal_SIGNAL_SIGTERM
	default:
		return errdefs.InvalidField("signal", "must be 9 (SIGKILL) or 15 (SIGTERM), got %d", sig)
	}
	sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: uint32(pid)}}
	if _, err := sb.agent.process.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: sel, Signal: s})); err != nil {
		return m.agentError(ctx, id, err, "")
	}
	if sig == 9 {
		// Make sure from outside too: the agent's kill could be raced by a
		// process that keeps forking.
		m.killGroup(sb, pid)
		m.disarmKiller(sb, pid)
	}
	return nil
}

// SendStdin writes data to command pid's stdin and, with closeAfter,
// closes it. The command must have been started with KeepStdin.
func (m *Manager) SendStdin(ctx context.Context, id string, pid int, data []byte, closeAfter bool) error {
	p, err := m.prepareExec(ctx, id, int64(len(data)))
	if err != nil {
		return err
	}
	defer p.Close()
	return p.SendStdin(ctx, pid, data, nil, closeAfter)
}

func (m *Manager) sendStdin(ctx context.Context, p *ExecPrep, pid int, data []byte, staged *node.Staged, closeAfter bool) error {
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
		sel := &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: uint32(pid)}}
		creq := connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: &processpb.ProcessInput{}})
		creq.Header().Set(wire.StdinHeader, staged.ID)
		_, err := sb.agent.process.SendInput(ctx, creq)
		p.taken(staged)
		if err != nil {
			return m.agentError(ctx, sb.id, err, "")
		}
	}
	if err := m.writeStdin(ctx, sb, pid, data, closeAfter); err != nil {
		return m.agentError(ctx, sb.id, err, "")
	}
	return nil
}
