package agent

import (
	"context"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// reaper is init's zombie reaper. It waits for any child on SIGCHLD and
// hands the status of children the agent started to whoever registered
// them; orphans reparented to the agent are reaped and forgotten.
//
// Registration and reaping share one mutex, so a child that exits before
// its parent registered it is still delivered: start holds the lock from
// fork to registration, and the reaper takes it before calling wait4.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan exitStatus
	wake    chan os.Signal
}

// exitStatus is how a child ended and the CPU time (user plus system) it
// and the descendants it waited for used.
type exitStatus struct {
	ws  syscall.WaitStatus
	cpu time.Duration
}

func newReaper() *reaper {
	r := &reaper{waiters: map[int]chan exitStatus{}, wake: make(chan os.Signal, 1)}
	signal.Notify(r.wake, syscall.SIGCHLD)
	return r
}

// start runs startFn (which forks a child and returns its pid) with the
// reaper locked, registers the pid and returns a channel that receives the
// child's wait status once.
func (r *reaper) start(startFn func() (int, error)) (int, <-chan exitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := startFn()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan exitStatus, 1)
	r.waiters[pid] = ch
	return pid, ch, nil
}

// run reaps children until ctx ends.
func (r *reaper) run(ctx context.Context) {
	for {
		r.reapAll()
		select {
		case <-ctx.Done():
			return
		case <-r.wake:
		}
	}
}

func (r *reaper) reapAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws syscall.WaitStatus
		var ru syscall.Rusage
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, &ru)
		if err == syscall.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- exitStatus{ws: ws, cpu: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
		}
	}
}
