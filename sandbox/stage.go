package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest"
	"github.com/forkbox/forkbox/internal/inflight"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/tenancy"
)

// ExecPrep is an exec or stdin call being set up in one session: it holds
// the session as a call in flight (an auto-paused session is resumed for
// it), the call's place in the in-flight budget, and the inputs it staged
// in the sandbox. Close gives all of them back. Its methods may be called
// from several goroutines.
type ExecPrep struct {
	c       *Commands
	sb      *Sandbox
	release func()
	hold    *inflight.Hold

	mu     sync.Mutex
	body   int64           // body bytes held in the budget
	staged map[string]bool // ids staged and not yet handed to a command
	closed bool
}

// PrepareExec begins an exec or stdin call in session id whose request
// body declares bodyBytes (<= 0: unknown; GrowBody counts it as it comes).
// It returns a 429 *errdefs.TypedError (inflight.Problem, Retry-After) when
// the caller's tenant or the host has too many exec bytes in flight, and
// use's errors for a session that cannot run commands now (404, 409, 410).
func (cs *Commands) PrepareExec(ctx context.Context, id string, bodyBytes int64) (node.ExecCall, error) {
	return cs.prepareExec(ctx, id, bodyBytes)
}

// prepareExec is PrepareExec with the concrete call.
func (cs *Commands) prepareExec(ctx context.Context, id string, bodyBytes int64) (*ExecPrep, error) {
	hold, err := cs.m.inflight.Acquire(tenancy.TenantOf(ctx, ""), node.ExecOverhead+max(bodyBytes, 0))
	if err != nil {
		return nil, err
	}
	sb, release, err := cs.m.use(ctx, id)
	if err != nil {
		hold.Release()
		return nil, err
	}
	return &ExecPrep{c: cs, sb: sb, release: release, hold: hold, body: max(bodyBytes, 0), staged: map[string]bool{}}, nil
}

// GrowBody counts n more body bytes than declared, with PrepareExec's
// refusal past a bound.
func (p *ExecPrep) GrowBody(n int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.hold.Grow(n); err != nil {
		return err
	}
	p.body += n
	return nil
}

// BodyDone gives back the body's bytes: it has been read and passed on.
func (p *ExecPrep) BodyDone() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold.ShrinkTo(node.ExecOverhead)
	p.body = 0
}

// Stage streams r into the sandbox's agent, which holds it in the
// sandbox's memory until a command takes it. A sandbox without room for
// it is ErrResourceExhausted; r's own error is returned as is.
func (p *ExecPrep) Stage(ctx context.Context, r io.Reader) (node.Staged, error) {
	reply, err := p.sb.agent.Stage(ctx, r)
	if err != nil {
		k, ok := guest.KindOf(err)
		err = p.c.hostCheck(ctx, p.sb.id, err)
		if ok && k == guest.Refused && errors.Is(err, errdefs.ErrResourceExhausted) {
			err = fmt.Errorf("session %s %w", p.sb.id, err) // "session X cannot hold the input ..."
		}
		return node.Staged{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		go p.c.unstage(p.sb, reply.ID)
		return node.Staged{}, errors.New("exec closed while staging")
	}
	p.staged[reply.ID] = true
	return reply, nil
}

// taken marks staged inputs as handed to a command (the agent takes them
// with the request that names them, also when that request fails).
func (p *ExecPrep) taken(in ...*node.Staged) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range in {
		if s != nil {
			delete(p.staged, s.ID)
		}
	}
}

// Exec runs req (Commands.Exec) with the inputs in staged instead of
// req.Cmd or req.Stdin.
func (p *ExecPrep) Exec(ctx context.Context, req node.ExecSpec, staged node.ExecInputs, out node.Output) (*node.ExecResult, error) {
	return p.c.exec(ctx, p, req, staged, out)
}

// SendStdin writes data and then staged (either may be empty) to command
// pid's stdin and, with closeAfter, closes it (Commands.SendStdin).
func (p *ExecPrep) SendStdin(ctx context.Context, pid int, data []byte, staged *node.Staged, closeAfter bool) error {
	return p.c.sendStdin(ctx, p, pid, data, staged, closeAfter)
}

// Close ends the call: staged inputs no command took are dropped, the
// session's hold and the budget's bytes given back. Closing twice is fine.
func (p *ExecPrep) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	left := p.staged
	p.staged = nil
	p.mu.Unlock()
	for id := range left {
		p.c.unstage(p.sb, id)
	}
	p.hold.Release()
	p.release()
}

// unstage drops a staged input the agent still holds (best effort: it
// expires by itself otherwise).
func (cs *Commands) unstage(sb *Sandbox, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = sb.agent.Unstage(ctx, id)
}
