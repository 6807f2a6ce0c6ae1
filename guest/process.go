package guest

import (
	"context"
	"fmt"
	"strconv"
	"syscall"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/internal/envdpb/processpb"
	"github.com/forkbox/forkbox/node"
)

// StartOpts is one process to start in the sandbox (Client.Start).
type StartOpts struct {
	// Cmd is the program (a path, or a name looked up in the sandbox's
	// PATH); Args its arguments after argv[0].
	Cmd  string
	Args []string
	// Env is added to the sandbox's environment; Cwd "" is the user's
	// home (or the sandbox's default directory).
	Env map[string]string
	Cwd string
	// User runs it (a name or number the sandbox knows).
	User string
	// Tag names it in List; "" for none.
	Tag string
	// Stdin gives it a stdin pipe (else /dev/null).
	Stdin bool
	// Script is a staged input (Client.Stage) the agent hands the shell
	// as its script (the shell is then Cmd, with no Args); StdinStage is a
	// staged input written into stdin before anything sent later, after
	// which stdin closes unless KeepStdin.
	Script, StdinStage string
	KeepStdin          bool
	// Collect > 0 asks for collected output: the agent keeps up to Collect
	// bytes of each stream in the sandbox's memory and sends them, stdout
	// first, after the process ended (Trailer.Truncated* say what was cut).
	Collect int64
}

// Start starts o and returns its event stream once the agent reported the
// start (Stream.Pid). ctx bounds the whole stream, not only the start.
// Staged inputs o names are the agent's from this call on, also when it
// fails. Errors are the agent's, unclassified (Classify; StartField names
// the field).
func (c *Client) Start(ctx context.Context, o StartOpts) (*Stream, error) {
	pc := &processpb.ProcessConfig{Cmd: o.Cmd, Args: o.Args, Envs: o.Env}
	if o.Cwd != "" {
		cwd := o.Cwd
		pc.Cwd = &cwd
	}
	stdin := o.Stdin
	start := &processpb.StartRequest{Process: pc, Stdin: &stdin}
	if o.Tag != "" {
		tag := o.Tag
		start.Tag = &tag
	}
	req := connect.NewRequest(start)
	setUser(req.Header(), o.User)
	if o.Script != "" {
		req.Header().Set(wire.ScriptHeader, o.Script)
	}
	if o.StdinStage != "" {
		req.Header().Set(wire.StdinHeader, o.StdinStage)
		if o.KeepStdin {
			req.Header().Set(wire.KeepStdinHeader, "1")
		}
	}
	setCollect(req.Header(), o.Collect)
	s, err := c.process.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	st := &Stream{
		receive: s.Receive, event: func() *processpb.ProcessEvent { return s.Msg().GetEvent() },
		err: s.Err, trailer: s.ResponseTrailer, close: s.Close,
	}
	if !st.receive() {
		st.Close()
		return nil, streamErr(s.Err())
	}
	st.pid = int(st.event().GetStart().GetPid())
	if st.pid == 0 {
		st.Close()
		// An answer, if a wrong one: nothing on the host to check.
		return nil, &Error{Kind: Refused, Err: fmt.Errorf("agent: first event is not start: %w", errdefs.ErrInternal)}
	}
	return st, nil
}

// Connect attaches to running process pid: its output from now on (with
// collect > 0, collected as for StartOpts.Collect) and its end. Leaving
// (ctx ends) does not stop the process. Errors are the agent's,
// unclassified (not_found when no such process runs or ran recently).
func (c *Client) Connect(ctx context.Context, pid int, collect int64) (*Stream, error) {
	req := connect.NewRequest(&processpb.ConnectRequest{Process: selector(pid)})
	setCollect(req.Header(), collect)
	s, err := c.process.Connect(ctx, req)
	if err != nil {
		return nil, err
	}
	st := &Stream{
		pid: pid, receive: s.Receive, event: func() *processpb.ProcessEvent { return s.Msg().GetEvent() },
		err: s.Err, trailer: s.ResponseTrailer, close: s.Close,
	}
	if !st.receive() {
		st.Close()
		return nil, streamErr(s.Err())
	}
	return st, nil
}

func setCollect(h interface{ Set(string, string) }, limit int64) {
	if limit > 0 {
		h.Set(wire.CollectHeader, strconv.FormatInt(limit, 10))
	}
}

func selector(pid int) *processpb.ProcessSelector {
	return &processpb.ProcessSelector{Selector: &processpb.ProcessSelector_Pid{Pid: uint32(pid)}}
}

// streamErr is the error of a stream that ended before its first event.
func streamErr(err error) error {
	if err == nil {
		return fmt.Errorf("agent stream ended before the start event: %w", errdefs.ErrUnavailable)
	}
	return err
}

// List returns the processes the agent runs (those it started).
func (c *Client) List(ctx context.Context) ([]node.Process, error) {
	resp, err := c.process.List(ctx, connect.NewRequest(&processpb.ListRequest{}))
	if err != nil {
		return nil, err
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

// Signal sends sig to process pid's process group from inside the
// sandbox. envd knows SIGTERM and SIGKILL only; another signal is an
// ErrInvalidArgument naming field "signal".
func (c *Client) Signal(ctx context.Context, pid int, sig syscall.Signal) error {
	var s processpb.Signal
	switch sig {
	case syscall.SIGKILL:
		s = processpb.Signal_SIGNAL_SIGKILL
	case syscall.SIGTERM:
		s = processpb.Signal_SIGNAL_SIGTERM
	default:
		return &Error{Kind: Refused, Err: errdefs.InvalidField("signal", "must be 9 (SIGKILL) or 15 (SIGTERM), got %d", int(sig))}
	}
	_, err := c.process.SendSignal(ctx, connect.NewRequest(&processpb.SendSignalRequest{Process: selector(pid), Signal: s}))
	return err
}

// stdinChunk is the most stdin bytes one SendInput carries.
const stdinChunk = 1 << 20

// WriteStdin writes data to process pid's stdin (in 1 MiB messages) and,
// with closeAfter, closes it; a process that already ended when it is
// closed (it read its input and went) is not an error.
func (c *Client) WriteStdin(ctx context.Context, pid int, data []byte, closeAfter bool) error {
	sel := selector(pid)
	for len(data) > 0 {
		n := min(len(data), stdinChunk)
		in := &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: data[:n]}}
		if _, err := c.process.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{Process: sel, Input: in})); err != nil {
			return err
		}
		data = data[n:]
	}
	if !closeAfter {
		return nil
	}
	_, err := c.process.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: sel}))
	if connect.CodeOf(err) == connect.CodeNotFound {
		return nil
	}
	return err
}

// WriteStaged writes the staged input stage (Client.Stage) into process
// pid's stdin; the agent takes the input with this call, also when it
// fails.
func (c *Client) WriteStaged(ctx context.Context, pid int, stage string) error {
	req := connect.NewRequest(&processpb.SendInputRequest{Process: selector(pid), Input: &processpb.ProcessInput{}})
	req.Header().Set(wire.StdinHeader, stage)
	_, err := c.process.SendInput(ctx, req)
	return err
}
