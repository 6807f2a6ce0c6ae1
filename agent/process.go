package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/internal/envdpb/processpb"
	"github.com/forkbox/forkbox/internal/envdpb/processpb/processpbconnect"
)

// processService implements envd's process.Process service.
type processService struct {
	processpbconnect.UnimplementedProcessHandler
	a *Agent
}

var _ processpbconnect.ProcessHandler = (*processService)(nil)

// defaultKeepalive is the keepalive period on streams when the client sends
// no Keepalive-Ping-Interval header.
const defaultKeepalive = 90 * time.Second

// keepaliveInterval reads Keepalive-Ping-Interval (seconds), as E2B SDKs send it.
func keepaliveInterval(h interface{ Get(string) string }) time.Duration {
	if n, err := strconv.Atoi(h.Get("Keepalive-Ping-Interval")); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return defaultKeepalive
}

// Start launches a process as the user named in the Basic authorization
// header (else the default user) and streams its events: start (pid), data
// chunks, end. A Connect deadline (Connect-Timeout-Ms) bounds the process's
// life: it is killed then, even if the client has gone; a client that
// disconnects earlier leaves it running. forkbox's headers name staged
// inputs (wire.ScriptHeader, wire.StdinHeader: stage.go) and ask for collected
// output (wire.CollectHeader: collect.go).
func (s *processService) Start(ctx context.Context, req *connect.Request[processpb.StartRequest], stream *connect.ServerStream[processpb.StartResponse]) error {
	script, err := s.a.stages.takeHeader(req.Header(), wire.ScriptHeader)
	if err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	stdinData, err := s.a.stages.takeHeader(req.Header(), wire.StdinHeader)
	if err != nil {
		if script != nil {
			script.Close()
		}
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	ls, err := s.prepareLaunch(req, script, stdinData)
	if err != nil {
		return err
	}
	deadline, _ := ctx.Deadline()
	sub := newSubscriber(parseCollect(req.Header()))
	defer close(sub.gone)
	if sub.collect != nil {
		defer sub.collect.close()
	}
	p, err := s.a.launch(ls, req.Msg.GetTag(), req.Msg.GetProcess(), sub, deadline)
	if err != nil {
		ls.close()
		return err
	}
	defer p.unsubscribe(sub)
	err = s.follow(ctx, p, sub, req.Header(), func(ev *processpb.ProcessEvent) error {
		return stream.Send(&processpb.StartResponse{Event: ev})
	})
	if err == nil && p.ended() {
		// forkbox extensions for the audit record and the result; E2B
		// clients ignore trailers they do not know.
		setResultTrailers(stream.ResponseTrailer(), p, sub)
	}
	return err
}

// prepareLaunch resolves a Start request into a launch spec that owns the
// staged script and stdin (closed here on error).
func (s *processService) prepareLaunch(req *connect.Request[processpb.StartRequest], script, stdinData *os.File) (*launchSpec, error) {
	closeAll := func() {
		for _, f := range []*os.File{script, stdinData} {
			if f != nil {
				_ = f.Close()
			}
		}
	}
	acc, err := s.a.accounts.lookup(userFromRequest(req.Header(), s.a.config().DefaultUser))
	if err != nil {
		closeAll()
		return nil, err
	}
	ls, err := s.a.buildLaunch(req.Msg, acc)
	if err != nil {
		closeAll()
		return nil, err
	}
	if script != nil {
		if err := ls.useScript(script); err != nil {
			ls.close()
			if stdinData != nil {
				stdinData.Close()
			}
			return nil, err
		}
	}
	if stdinData != nil {
		if err := ls.useStdin(stdinData, req.Header().Get(wire.KeepStdinHeader) == "1"); err != nil {
			ls.close()
			return nil, err
		}
	}
	return ls, nil
}

// setResultTrailers sets the trailers of a stream that ends with process
// p: its CPU time and run time, and what collected output was cut.
func setResultTrailers(t http.Header, p *proc, sub *subscriber) {
	t.Set(wire.CPUTrailer, strconv.FormatInt(time.Duration(p.cpu.Load()).Milliseconds(), 10))
	t.Set(wire.DurationTrailer, strconv.FormatInt(time.Duration(p.ran.Load()).Milliseconds(), 10))
	if sub.collect != nil {
		if cut := sub.collect.truncated(); cut != "" {
			t.Set(wire.TruncatedTrailer, cut)
		}
	}
}

// Connect re-attaches to a process by pid or tag: start, then its events
// from now on (collected, with wire.CollectHeader). A process that ended within
// the last minute yields start and end. A stream that ends with the
// process carries the same trailers as Start's (CPU and run time).
func (s *processService) Connect(ctx context.Context, req *connect.Request[processpb.ConnectRequest], stream *connect.ServerStream[processpb.ConnectResponse]) error {
	p, err := s.find(req.Msg.GetProcess())
	if err != nil {
		return err
	}
	sub := newSubscriber(parseCollect(req.Header()))
	defer close(sub.gone)
	if sub.collect != nil {
		defer sub.collect.close()
	}
	p.subscribe(sub)
	defer p.unsubscribe(sub)
	err = s.follow(ctx, p, sub, req.Header(), func(ev *processpb.ProcessEvent) error {
		return stream.Send(&processpb.ConnectResponse{Event: ev})
	})
	if err == nil && p.ended() {
		setResultTrailers(stream.ResponseTrailer(), p, sub)
	}
	return err
}

// follow sends the start event and then sub's events until the end event,
// with keepalives in between.
func (s *processService) follow(ctx context.Context, p *proc, sub *subscriber, h interface{ Get(string) string }, send func(*processpb.ProcessEvent) error) error {
	start := &processpb.ProcessEvent{Event: &processpb.ProcessEvent_Start{Start: &processpb.ProcessEvent_StartEvent{Pid: uint32(p.pid)}}}
	if err := send(start); err != nil {
		return err
	}
	ka := time.NewTicker(keepaliveInterval(h))
	defer ka.Stop()
	for {
		select {
		case ev := <-sub.ch:
			if ev.GetEnd() != nil && sub.collect != nil {
				if err := sub.collect.send(send); err != nil {
					return err
				}
			}
			if err := send(ev); err != nil {
				return err
			}
			if ev.GetEnd() != nil {
				return nil
			}
		case <-ka.C:
			if err := send(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Keepalive{Keepalive: &processpb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
		}
	}
}

// List returns the running processes, by pid.
func (s *processService) List(ctx context.Context, req *connect.Request[processpb.ListRequest]) (*connect.Response[processpb.ListResponse], error) {
	out := &processpb.ListResponse{}
	for _, p := range s.a.procs.running() {
		info := &processpb.ProcessInfo{Config: p.config, Pid: uint32(p.pid)}
		if p.tag != "" {
			tag := p.tag
			info.Tag = &tag
		}
		out.Processes = append(out.Processes, info)
	}
	sort.Slice(out.Processes, func(i, j int) bool { return out.Processes[i].Pid < out.Processes[j].Pid })
	return connect.NewResponse(out), nil
}

// SendInput writes to a process's stdin pipe or PTY; with wire.StdinHeader the
// staged input it names goes to the stdin pipe first (the message's own
// input may then be empty).
func (s *processService) SendInput(ctx context.Context, req *connect.Request[processpb.SendInputRequest]) (*connect.Response[processpb.SendInputResponse], error) {
	staged, err := s.a.stages.takeHeader(req.Header(), wire.StdinHeader)
	if err != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, err)
	}
	p, err := s.findRunning(req.Msg.GetProcess())
	if err != nil {
		if staged != nil {
			staged.Close()
		}
		return nil, err
	}
	if staged != nil {
		p.stdinMu.Lock()
		err := p.writeStaged(ctx, staged)
		p.stdinMu.Unlock()
		if err != nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, err)
		}
		if req.Msg.GetInput().GetInput() == nil {
			return connect.NewResponse(&processpb.SendInputResponse{}), nil
		}
	}
	if err := writeProcessInput(p, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&processpb.SendInputResponse{}), nil
}

func writeProcessInput(p *proc, in *processpb.ProcessInput) error {
	var err error
	switch v := in.GetInput().(type) {
	case *processpb.ProcessInput_Stdin:
		err = p.writeInput(v.Stdin, false)
	case *processpb.ProcessInput_Pty:
		err = p.writeInput(v.Pty, true)
	default:
		return connect.NewError(connect.CodeInvalidArgument, errors.New("input must be stdin or pty"))
	}
	if err != nil {
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return nil
}

// StreamInput takes a start event naming the process, then data events in order.
func (s *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[processpb.StreamInputRequest]) (*connect.Response[processpb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *processpb.StreamInputRequest_Start:
			var err error
			if p, err = s.findRunning(ev.Start.GetProcess()); err != nil {
				return nil, err
			}
		case *processpb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("data before start"))
			}
			if err := writeProcessInput(p, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&processpb.StreamInputResponse{}), nil
}

// SendSignal sends SIGTERM or SIGKILL to the process's group.
func (s *processService) SendSignal(ctx context.Context, req *connect.Request[processpb.SendSignalRequest]) (*connect.Response[processpb.SendSignalResponse], error) {
	p, err := s.findRunning(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case processpb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case processpb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("unsupported signal %v", req.Msg.GetSignal()))
	}
	if err := p.signal(sig); err != nil {
		if errors.Is(err, errProcessEnded) {
			return nil, connect.NewError(connect.CodeNotFound, err)
		}
		return nil, connect.NewError(connect.CodeInternal, err)
	}
	return connect.NewResponse(&processpb.SendSignalResponse{}), nil
}

// CloseStdin closes a process's stdin pipe so its reader sees EOF.
func (s *processService) CloseStdin(ctx context.Context, req *connect.Request[processpb.CloseStdinRequest]) (*connect.Response[processpb.CloseStdinResponse], error) {
	p, err := s.findRunning(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if p.pty != nil {
		return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("a PTY process has no stdin pipe; send Ctrl-D (0x04) instead"))
	}
	p.closeStdin()
	return connect.NewResponse(&processpb.CloseStdinResponse{}), nil
}

// Update resizes a process's PTY.
func (s *processService) Update(ctx context.Context, req *connect.Request[processpb.UpdateRequest]) (*connect.Response[processpb.UpdateResponse], error) {
	p, err := s.findRunning(req.Msg.GetProcess())
	if err != nil {
		return nil, err
	}
	if req.Msg.Pty != nil {
		if p.pty == nil {
			return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("process has no pty"))
		}
		if err := resizePTY(p.pty, req.Msg.GetPty().GetSize()); err != nil {
			return nil, connect.NewError(connect.CodeInternal, err)
		}
	}
	return connect.NewResponse(&processpb.UpdateResponse{}), nil
}

func (s *processService) find(sel *processpb.ProcessSelector) (*proc, error) {
	pid, tag := int(sel.GetPid()), sel.GetTag()
	if pid == 0 && tag == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process selector needs a pid or a tag"))
	}
	p := s.a.procs.find(pid, tag)
	if p == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %s not found", selectorString(sel)))
	}
	return p, nil
}

func (s *processService) findRunning(sel *processpb.ProcessSelector) (*proc, error) {
	p, err := s.find(sel)
	if err != nil {
		return nil, err
	}
	if p.ended() {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %s has ended", selectorString(sel)))
	}
	return p, nil
}

func selectorString(sel *processpb.ProcessSelector) string {
	if sel.GetPid() != 0 {
		return "pid " + strconv.Itoa(int(sel.GetPid()))
	}
	return "tag " + strconv.Quote(sel.GetTag())
}
