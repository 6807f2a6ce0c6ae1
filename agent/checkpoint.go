package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/guest/wire"
)

// The checkpoint handshake lets a runtime save a sandbox whose agent
// listens on a host Unix socket (gVisor cannot save a bound host socket):
//
//  1. The daemon sends POST /snapshot/prepare {"generation": G}. The agent
//     answers 204, then closes its listener (unlinking the socket) and
//     every connection. Its processes keep running; their output waits in
//     their pipes.
//  2. The daemon checkpoints the sandbox.
//  3. The daemon writes a wire.ResumeFile with generation G to the control file
//     (wire.ControlEnv, in a directory the sandbox mounts read-only). The agent
//     polls for it, applies it (hostname) and listens again.
//
// A clone restored from the checkpoint is an agent at step 3 whose control
// file, written before the restore, already holds its own wire.ResumeFile. An
// agent that sees no wire.ResumeFile for resumeWait listens again by itself, so
// that a daemon that died mid-snapshot does not leave it deaf.

// resumeWait is how long a prepared agent waits for its wire.ResumeFile.
const resumeWait = 60 * time.Second

// resumePoll is how often a prepared agent reads the control file.
const resumePoll = 2 * time.Millisecond

// handlePrepare accepts a prepare: 204, then the server that served it is
// closed (Serve's loop then waits for the wire.ResumeFile). 409 when this agent
// cannot take part (no control file or own socket), 400 for a bad body.
func (a *Agent) handlePrepare(w http.ResponseWriter, r *http.Request) {
	if a.control == "" || a.listenPath == "" {
		writeJSONError(w, http.StatusConflict, "this sandbox's runtime takes no memory snapshots")
		return
	}
	var req wire.PrepareRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4096)).Decode(&req); err != nil || req.Generation == 0 {
		writeJSONError(w, http.StatusBadRequest, "prepare: want {\"generation\": N > 0}")
		return
	}
	a.srvMu.Lock()
	srv := a.srv
	a.prepared = req.Generation
	a.srvMu.Unlock()
	w.WriteHeader(http.StatusNoContent)
	_ = http.NewResponseController(w).Flush()
	a.log.Info("prepared for a checkpoint", "generation", req.Generation)
	go func() {
		// The socket file goes only once the listener is closed: the daemon
		// checkpoints as soon as it is gone, and a still-bound socket
		// cannot be saved. (Go's own unlink-on-close unlinks first.)
		_ = srv.Close()
		a.closeTunnels()
		_ = os.Remove(a.listenPath)
	}()
}

// listen binds the agent's own socket at a.listenPath, mode 0600.
func (a *Agent) listen() (net.Listener, error) {
	_ = os.Remove(a.listenPath)
	old := unix.Umask(0o177)
	defer unix.Umask(old)
	l, err := net.Listen("unix", a.listenPath)
	if err != nil {
		return nil, err
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	return l, nil
}

// awaitResume polls the control file until it holds a wire.ResumeFile for gen
// (or generation 0, which a daemon that lost track of gen writes), or
// resumeWait's worth of polls pass, or ctx ends, and applies it. Polls are
// counted rather than timed: a clone restored long after the snapshot has
// a clock that moved on, and must still read its file.
func (a *Agent) awaitResume(ctx context.Context, gen uint64) {
	for i := 0; i < int(resumeWait/resumePoll) && ctx.Err() == nil; i++ {
		var rf wire.ResumeFile
		if b, err := os.ReadFile(a.control); err == nil && json.Unmarshal(b, &rf) == nil &&
			(rf.Generation == gen || rf.Generation == 0) {
			if rf.Hostname != "" {
				if err := unix.Sethostname([]byte(rf.Hostname)); err != nil {
					a.log.Warn("set hostname after restore", "err", err)
				}
			}
			a.log.Info("resumed after a checkpoint", "generation", gen)
			return
		}
		time.Sleep(resumePoll)
	}
	a.log.Warn("no resume file for the checkpoint; listening again", "generation", gen)
}

// checkBoundingSet fails when CAP_SYS_ADMIN is in the agent's capability
// bounding set: a program the agent starts as root would then have it.
// The runtimes never put it there (the gVisor driver grants it to the
// agent, which sets a restored clone's hostname with it, in the effective
// and permitted sets only), so this guards the rule against a runtime
// configured otherwise. It reads the set with prctl, which works however
// the agent was built.
func checkBoundingSet() error {
	in, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, unix.CAP_SYS_ADMIN, 0, 0, 0)
	if err != nil {
		return fmt.Errorf("read the capability bounding set: %w", err)
	}
	if in == 1 {
		return errors.New("CAP_SYS_ADMIN is in the capability bounding set, so every program started as root " +
			"could have it: the runtime must grant it in the effective and permitted sets only")
	}
	return nil
}
