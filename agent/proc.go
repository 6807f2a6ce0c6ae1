package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/internal/envdpb/processpb"
)

// outputChunk is the largest data event the agent sends, in bytes.
const outputChunk = 32 << 10

// drainAfterExit is how long output is still read after the main process
// exits. Data already in the pipe is always read; the bound only matters
// when a background child keeps the pipe open, so that the command returns
// when its main process exits.
const drainAfterExit = 20 * time.Millisecond

// keepFinished is how long an ended process stays visible to Connect.
const keepFinished = 60 * time.Second

// proc is one process started through the Process service.
type proc struct {
	pid    int
	tag    string
	config *processpb.ProcessConfig
	seq    uint64 // start order, set by procTable.add

	stdinMu sync.Mutex
	stdin   *os.File // write end of the stdin pipe; nil when /dev/null or closed
	// stdinPipe is the same pipe end, set once at launch and never
	// cleared, so that a write blocked under stdinMu can be cut short
	// (abortStdin) without the lock.
	stdinPipe *os.File
	pty       *os.File // PTY master; nil without a PTY

	// began is when the process started; cpu is the CPU time it used and
	// ran how long it ran until its exit (both time.Duration), set before
	// it is marked ended.
	began time.Time
	cpu   atomic.Int64
	ran   atomic.Int64

	mu   sync.Mutex
	subs map[*subscriber]struct{}
	end  *processpb.ProcessEvent_EndEvent
	done chan struct{} // closed once end is set
}

// subscriber is one stream (Start or Connect) receiving a process's events.
type subscriber struct {
	ch   chan *processpb.ProcessEvent
	gone chan struct{} // closed by the stream handler when it returns
	// collect, when set, keeps data events instead of sending them
	// (collect.go); the end event still comes through ch.
	collect *collection
}

func newSubscriber(collect *collection) *subscriber {
	return &subscriber{ch: make(chan *processpb.ProcessEvent, 64), gone: make(chan struct{}), collect: collect}
}

// subscribe adds s; if the process already ended, s gets the end event now.
func (p *proc) subscribe(s *subscriber) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		s.ch <- endEvent(p.end)
		return
	}
	p.subs[s] = struct{}{}
}

func (p *proc) unsubscribe(s *subscriber) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
}

// broadcast delivers ev to every current subscriber, waiting for slow ones
// (that is the back-pressure that slows a chatty process down) but not for
// ones whose stream has gone.
func (p *proc) broadcast(ev *processpb.ProcessEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		if s.collect != nil && ev.GetData() != nil {
			s.collect.add(ev.GetData())
			continue
		}
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

// finish records the end event and sends it to every subscriber. The end
// is recorded and the subscribers taken in one step, so a subscriber that
// arrives meanwhile gets the end event from subscribe instead of never; done
// closes before any subscriber hears of the end, so a caller that has seen
// the end event also sees ended (a signal sent then is not_found).
func (p *proc) finish(end *processpb.ProcessEvent_EndEvent) {
	ev := endEvent(end)
	p.mu.Lock()
	p.end = end
	subs := p.subs
	p.subs = nil
	close(p.done)
	p.mu.Unlock()
	for s := range subs {
		select {
		case s.ch <- ev:
		case <-s.gone:
		}
	}
}

func (p *proc) ended() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig to the process's whole process group (the agent starts
// every process as a group leader).
func (p *proc) signal(sig syscall.Signal) error {
	if p.ended() {
		return errProcessEnded
	}
	if err := syscall.Kill(-p.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

var errProcessEnded = errors.New("process has ended")

// writeInput writes b to the process's stdin pipe or, when pty is set, its PTY.
func (p *proc) writeInput(b []byte, toPTY bool) error {
	if toPTY {
		if p.pty == nil {
			return errors.New("process has no pty")
		}
		_, err := p.pty.Write(b)
		return err
	}
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin == nil {
		return errors.New("stdin is not open (start the process with stdin enabled)")
	}
	_, err := p.stdin.Write(b)
	return err
}

// closeStdin closes the stdin pipe after any write in progress; closing
// twice is fine.
func (p *proc) closeStdin() {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdin != nil {
		_ = p.stdin.Close()
		p.stdin = nil
	}
}

// abortStdin cuts short a write to the stdin pipe that is blocked (a
// process that ended while a child of it holds the pipe and reads
// nothing) and closes the pipe.
func (p *proc) abortStdin() {
	if p.stdinPipe != nil {
		_ = p.stdinPipe.SetWriteDeadline(time.Now())
	}
	p.closeStdin()
}

// writeStaged copies staged input f into the stdin pipe and closes f.
// The caller holds stdinMu, so input sent meanwhile waits for it. ctx
// ending cuts the copy short.
func (p *proc) writeStaged(ctx context.Context, f *os.File) error {
	defer f.Close()
	if p.stdin == nil {
		return errors.New("stdin is not open (start the process with stdin enabled)")
	}
	stop := context.AfterFunc(ctx, func() { _ = p.stdinPipe.SetWriteDeadline(time.Now()) })
	defer func() {
		if stop() {
			_ = p.stdinPipe.SetWriteDeadline(time.Time{})
		}
	}()
	// Plain reads and writes (no splice), so the write deadline applies.
	_, err := io.CopyBuffer(struct{ io.Writer }{p.stdin}, struct{ io.Reader }{f}, make([]byte, 64<<10))
	return err
}

// pump reads r in chunks and broadcasts each as a data event built by wrap,
// until EOF or, once exited is closed, until nothing more arrives within
// drainAfterExit.
func (p *proc) pump(r *os.File, exited <-chan struct{}, wrap func([]byte) *processpb.ProcessEvent_DataEvent) {
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-exited:
			_ = r.SetReadDeadline(time.Now().Add(drainAfterExit))
		case <-stop:
		}
	}()
	buf := make([]byte, outputChunk)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			chunk := make([]byte, n)
			copy(chunk, buf[:n])
			p.broadcast(&processpb.ProcessEvent{Event: &processpb.ProcessEvent_Data{Data: wrap(chunk)}})
			select {
			case <-exited: // more data: keep draining a little longer
				_ = r.SetReadDeadline(time.Now().Add(drainAfterExit))
			default:
			}
		}
		if err != nil {
			// The poller reports an expired deadline without reading, so
			// output already in the pipe (the goroutine ran late) is
			// still read before the drain counts as over.
			if errors.Is(err, os.ErrDeadlineExceeded) && pending(r) {
				_ = r.SetReadDeadline(time.Now().Add(drainAfterExit))
				continue
			}
			// io.EOF: every writer closed; os.ErrDeadlineExceeded: the drain
			// after exit is over; EIO: a PTY master whose terminal closed.
			return
		}
	}
}

// pending reports whether f (a pipe or PTY master) has bytes to read now
// (TIOCINQ is FIONREAD).
func pending(f *os.File) bool {
	sc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	if err := sc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) }); err != nil {
		return false
	}
	return n > 0
}

func endEvent(e *processpb.ProcessEvent_EndEvent) *processpb.ProcessEvent {
	return &processpb.ProcessEvent{Event: &processpb.ProcessEvent_End{End: e}}
}

// endFromStatus turns a wait status into envd's end event: exit code and
// "exit status N" for a normal exit; exit code -1, exited false and
// "signal: <name>" for a signal death. error repeats the status when the
// process did not exit with 0.
func endFromStatus(ws syscall.WaitStatus) *processpb.ProcessEvent_EndEvent {
	e := &processpb.ProcessEvent_EndEvent{}
	switch {
	case ws.Exited():
		e.ExitCode = int32(ws.ExitStatus())
		e.Exited = true
		e.Status = fmt.Sprintf("exit status %d", ws.ExitStatus())
	case ws.Signaled():
		e.ExitCode = -1
		e.Status = "signal: " + ws.Signal().String()
		if ws.CoreDump() {
			e.Status += " (core dumped)"
		}
	default:
		e.ExitCode = -1
		e.Status = "unknown"
	}
	if !e.Exited || e.ExitCode != 0 {
		s := e.Status
		e.Error = &s
	}
	return e
}

// procTable holds running and recently ended processes by pid and tag.
type procTable struct {
	mu    sync.Mutex
	byPID map[int]*proc
	seq   uint64 // processes added so far
}

func newProcTable() *procTable { return &procTable{byPID: map[int]*proc{}} }

func (t *procTable) add(p *proc) {
	t.mu.Lock()
	t.seq++
	p.seq = t.seq
	t.byPID[p.pid] = p
	t.mu.Unlock()
}

// forgetLater removes p keepFinished after it ended.
func (t *procTable) forgetLater(p *proc) {
	time.AfterFunc(keepFinished, func() {
		t.mu.Lock()
		if t.byPID[p.pid] == p {
			delete(t.byPID, p.pid)
		}
		t.mu.Unlock()
	})
}

// find returns the process with pid, or (when pid is 0) the one with tag:
// the most recently started running one, else the most recently started.
func (t *procTable) find(pid int, tag string) *proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	if pid != 0 {
		return t.byPID[pid]
	}
	var best *proc
	for _, p := range t.byPID {
		if tag == "" || p.tag != tag {
			continue
		}
		if best == nil {
			best = p
			continue
		}
		pRunning, bestRunning := !p.ended(), !best.ended()
		if pRunning != bestRunning {
			if pRunning {
				best = p
			}
			continue
		}
		if p.seq > best.seq {
			best = p
		}
	}
	return best
}

// running returns the processes that have not ended, by pid.
func (t *procTable) running() []*proc {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*proc
	for _, p := range t.byPID {
		if !p.ended() {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pid < out[j].pid })
	return out
}

// signalAll forwards sig to every running process group and returns how many.
func (t *procTable) signalAll(sig syscall.Signal) int {
	n := 0
	for _, p := range t.running() {
		if p.signal(sig) == nil {
			n++
		}
	}
	return n
}

// waitIdle waits until no process runs, or at most timeout.
func (t *procTable) waitIdle(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for len(t.running()) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
}
