package agent

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The checkpoint handshake lets a runtime save a sandbox whose agent
// listens on a host Unix socket (gVisor cannot save a bound host socket):
//
//  1. The daemon sends POST /snapshot/prepare {"generation": G}. The agent
//     answers 204, then closes its listener (unlinking the socket) and
//     every connection. Its processes keep running; their output waits in
//     their pipes.
//  2. The daemon checkpoints the sandbox.
//  3. The daemon writes a ResumeFile with generation G to the control file
//     (ControlEnv, in a directory the sandbox mounts read-only). The agent
//     polls for it, applies it (hostname) and listens again.
//
// A clone restored from the checkpoint is an agent at step 3 whose control
// file, written before the restore, already holds its own ResumeFile. An
// agent that sees no ResumeFile for resumeWait listens again by itself, so
// that a daemon that died mid-snapshot does not leave it deaf.

// ControlEnv names the control file the agent polls after a prepare; the
// handshake is refused when it is unset (the runc tier needs none).
const ControlEnv = "FORKBOX_AGENT_CONTROL"

// PrepareRequest is the body of POST /snapshot/prepare.
type PrepareRequest struct {
	// Generation identifies this snapshot; the ResumeFile that ends it
	// must carry the same one. It is > 0 and grows with each snapshot.
	Generation uint64 `json:"generation"`
}

// ResumeFile is the JSON the daemon writes to the control file to end a
// prepare: the agent takes it when its Generation is the prepared one, or
// 0 (a daemon restarted mid-snapshot that no longer knows it).
type ResumeFile struct {
	Generation uint64 `json:"generation"`
	// Hostname, when set, becomes the sandbox's hostname (a clone's own).
	Hostname string `json:"hostname,omitempty"`
}

// resumeWait is how long a prepared agent waits for its ResumeFile.
const resumeWait = 60 * time.Second

// resumePoll is how often a prepared agent reads the control file.
const resumePoll = 2 * time.Millisecond

// handlePrepare accepts a prepare: 204, then the server that served it is
// closed (Serve's loop then waits for the ResumeFile). 409 when this agent
// cannot take part (no control file or own socket), 400 for a bad body.
func (a *Agent) handlePrepare(w http.ResponseWriter, r *http.Request) {
	if a.control == "" || a.listenPath == "" {
		writeJSONError(w, http.StatusConflict, "this sandbox's runtime takes no memory snapshots")
		return
	}
	var req PrepareRequest
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

// awaitResume polls the control file until it holds a ResumeFile for gen
// (or generation 0, which a daemon that lost track of gen writes), or
// resumeWait's worth of polls pass, or ctx ends, and applies it. Polls are
// counted rather than timed: a clone restored long after the snapshot has
// a clock that moved on, and must still read its file.
func (a *Agent) awaitResume(ctx context.Context, gen uint64) {
	for i := 0; i < int(resumeWait/resumePoll) && ctx.Err() == nil; i++ {
		var rf ResumeFile
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

// dropAdminCapabilities removes CAP_SYS_ADMIN and CAP_SETPCAP from the
// bounding set of every thread when the agent has them (the gVisor driver
// grants them so that the agent can set a clone's hostname): the agent
// keeps them, but no process it starts, root included, can gain them.
func dropAdminCapabilities() error {
	var hdr = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	if data[0].Effective&(1<<unix.CAP_SETPCAP) == 0 {
		return nil
	}
	for _, c := range []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_SETPCAP} {
		if _, _, errno := syscall.AllThreadsSyscall(unix.SYS_PRCTL, unix.PR_CAPBSET_DROP, c, 0); errno != 0 {
			return errors.New("PR_CAPBSET_DROP: " + errno.Error())
		}
	}
	return nil
}
