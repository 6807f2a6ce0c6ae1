package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/internal/freeport"
	"github.com/forkbox/forkbox/storage/seal"
)

// GroupReplicate is the fleet's snapshot rows: two `forkbox serve`
// hosts of the run's own (a and b, each its own data directory) on one
// NATS server with JetStream in the benchmark's process (--nats), one
// snapshot key. b's session holds replicateMB of random data; each round
// b snapshots it and the row times from the snapshot's answer until the
// fleet's directory says its copy is in the object store (export, seal,
// upload: the background copy), beside `cp` of a file of the same bytes
// with an fsync; then a forks it, the first time pulling it from the
// object store (pull, verify, decrypt, import, start), and again with
// the snapshot already here.
const GroupReplicate = "replicate"

// replicateMB is what the replicated snapshot holds beyond its template,
// in MB (10^6 bytes).
const replicateMB = 64

// The replicate rows' operations.
const (
	// OpReplicate is a files snapshot's copy into the object store.
	OpReplicate = "replicate: files snapshot copied to the object store"
	// OpRestorePulled is a fork on a of b's snapshot, pulled first.
	OpRestorePulled = "restore: fork of another host's snapshot, pulled from the object store"
	// OpRestoreLocal is the same fork again, the snapshot already here.
	OpRestoreLocal = "restore: fork of another host's snapshot, already pulled"
)

// fleetHostProc is one `forkbox serve` of the replicate rows.
type fleetHostProc struct {
	dir string
	cmd *exec.Cmd
	c   *client.Client
}

// replicateFleet is the replicate rows' NATS server, hosts and a
// directory reader.
type replicateFleet struct {
	tmp   string
	ns    *server.Server
	f     *fleet.Fleet
	dir   *fleet.Directory
	hosts []*fleetHostProc
}

// openReplicateFleet starts the NATS server and hosts a and b.
func (e *env) openReplicateFleet(ctx context.Context) (rf *replicateFleet, retErr error) {
	tmp, err := os.MkdirTemp("", "forkbox-bench-fleet-")
	if err != nil {
		return nil, err
	}
	made := &replicateFleet{tmp: tmp}
	defer func() {
		if retErr != nil {
			made.close()
		}
	}()
	rf = made
	if err := os.Chmod(tmp, 0o711); err != nil {
		return nil, err
	}
	token := randomHex(16)
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: filepath.Join(tmp, "nats"), Authorization: token, NoSigs: true, NoLog: true})
	if err != nil {
		return nil, err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("the benchmark's NATS server did not start")
	}
	rf.ns = ns
	url := fmt.Sprintf("nats://%s@%s", token, ns.Addr().String())
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	if rf.f, err = fleet.Start(ctx, fleet.Options{URL: url, NodeID: "bench"}, quiet); err != nil {
		return nil, err
	}
	if rf.dir, err = fleet.OpenDirectory(ctx, rf.f); err != nil {
		return nil, err
	}
	bin, err := e.forkboxPath()
	if err != nil {
		return nil, err
	}
	keyEnv := seal.KeyEnv + "=" + randomHex(32)
	for _, id := range []string{"a", "b"} {
		h, err := startFleetHost(ctx, bin, filepath.Join(tmp, id), id, url, keyEnv, e.opts.AgentPath)
		if h != nil {
			rf.hosts = append(rf.hosts, h)
		}
		if err != nil {
			return nil, fmt.Errorf("host %s: %w", id, err)
		}
	}
	return rf, nil
}

// forkboxPath is Options.ForkboxPath, or the running executable.
func (e *env) forkboxPath() (string, error) {
	if e.opts.ForkboxPath != "" {
		return e.opts.ForkboxPath, nil
	}
	return os.Executable()
}

// startFleetHost starts `forkbox serve` as host id of the fleet on url
// and waits (at most 2 minutes) until its API answers.
func startFleetHost(ctx context.Context, bin, dir, id, url, keyEnv, agent string) (*fleetHostProc, error) {
	addr, err := freeport.LoopbackAddr()
	if err != nil {
		return nil, err
	}
	args := []string{"serve", "--data-dir", dir, "--listen", addr, "--nats", url, "--node-id", id,
		"--spares", "0", "--stop-sessions", "--storage-size", "2", "--log-level", "warn"}
	if agent != "" {
		args = append(args, "--agent", agent)
	}
	h := &fleetHostProc{dir: dir, cmd: exec.Command(bin, args...)}
	h.cmd.Env = append(os.Environ(), keyEnv)
	if err := h.cmd.Start(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if key, err := os.ReadFile(filepath.Join(dir, "api-key")); err == nil {
			c := client.New("http://"+addr, strings.TrimSpace(string(key)), &http.Client{Timeout: 5 * time.Second})
			if _, err := c.Info(ctx); err == nil {
				h.c = client.New("http://"+addr, strings.TrimSpace(string(key)), nil)
				return h, nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return h, errors.New("forkbox serve did not answer within 2 minutes")
}

// close stops the hosts (their sessions destroyed first), takes down
// what they left and stops the NATS server.
func (rf *replicateFleet) close() {
	for _, h := range rf.hosts {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if h.c != nil {
			if ss, err := h.c.ListSessions(ctx, client.ListOptions{}); err == nil {
				for _, s := range ss {
					_ = h.c.DeleteSession(ctx, s.ID)
				}
			}
		}
		cancel()
		_ = h.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = h.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(time.Minute):
			_ = h.cmd.Process.Kill()
			<-done
		}
		_ = exec.Command(h.cmd.Path, "down", "--data-dir", h.dir).Run()
		_ = daemon.ReleaseStorage(h.dir)
	}
	if rf.f != nil {
		rf.f.Close()
	}
	if rf.ns != nil {
		rf.ns.Shutdown()
		rf.ns.WaitForShutdown()
	}
	os.RemoveAll(rf.tmp)
}

// waitReplicated polls the directory until snapshot id is replicated.
func (rf *replicateFleet) waitReplicated(ctx context.Context, id string) error {
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		if l, err := rf.dir.Get(ctx, fleet.KindSnapshot, id); err == nil && l.Replicated {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(2 * time.Millisecond)
	}
	return fmt.Errorf("snapshot %s not replicated after 5 minutes", id)
}

// measureReplicate measures the replicate rows (GroupReplicate).
func (e *env) measureReplicate(ctx context.Context) []Result {
	all := []string{OpReplicate, OpRestorePulled, OpRestoreLocal}
	rf, err := e.openReplicateFleet(ctx)
	if err != nil {
		return failOps(all, SystemForkbox, err)
	}
	defer rf.close()
	a, b := rf.hosts[0], rf.hosts[1]
	src, _, err := b.c.CreateSession(ctx, client.CreateRequest{DiskMB: 2 * replicateMB}, "")
	if err != nil {
		return failOps(all, SystemForkbox, err)
	}
	write := fmt.Sprintf("head -c %d /dev/urandom > /home/user/blob && sync", replicateMB*1000*1000)
	if res, err := b.c.ExecCollect(ctx, src.ID, client.ExecRequest{Cmd: write}); err != nil || res.ExitCode != 0 {
		return failOps(all, SystemForkbox, fmt.Errorf("write the data: %v (exit %v)", err, res))
	}
	plain := filepath.Join(rf.tmp, "blob")
	if err := writeRandom(plain, replicateMB*1000*1000); err != nil {
		return failOps(all, SystemForkbox, err)
	}
	fork := func(ctx context.Context, id string) (time.Duration, error) {
		var child string
		d, err := timed(func() error {
			res, err := a.c.ForkSnapshot(ctx, id, client.ForkRequest{Count: 1})
			if err == nil {
				child = res.Sessions[0].ID
			}
			return err
		})
		if err == nil {
			err = a.c.DeleteSession(context.WithoutCancel(ctx), child)
		}
		return d, err
	}
	var pulled, local []time.Duration
	rounds := 0
	fb := contender{system: SystemForkbox, step: func(ctx context.Context) ([]time.Duration, error) {
		rounds++
		sn, err := b.c.Snapshot(ctx, src.ID, 0)
		if err != nil {
			return nil, err
		}
		began := time.Now()
		defer func() {
			cctx := context.WithoutCancel(ctx)
			_ = a.c.DeleteSnapshot(cctx, sn.ID, true)
			_ = b.c.DeleteSnapshot(cctx, sn.ID, true)
		}()
		if err := rf.waitReplicated(ctx, sn.ID); err != nil {
			return nil, err
		}
		copied := time.Since(began)
		dp, err := fork(ctx, sn.ID)
		if err != nil {
			return nil, err
		}
		dl, err := fork(ctx, sn.ID)
		if err != nil {
			return nil, err
		}
		if rounds > e.opts.Warmup {
			pulled, local = append(pulled, dp), append(local, dl)
		}
		return []time.Duration{copied}, nil
	}}
	cp := contender{system: SystemCopy, step: func(ctx context.Context) ([]time.Duration, error) {
		dst := plain + ".copy"
		defer os.Remove(dst)
		d, err := timed(func() error {
			if out, err := exec.CommandContext(ctx, "cp", plain, dst).CombinedOutput(); err != nil {
				return fmt.Errorf("cp: %v: %s", err, out)
			}
			f, err := os.Open(dst)
			if err != nil {
				return err
			}
			defer f.Close()
			return f.Sync()
		})
		return []time.Duration{d}, err
	}}
	e.opts.progressf("replicate: a %d MB files snapshot copied to the object store, then forked on another host, x %d",
		replicateMB, e.opts.Warmup+e.opts.N)
	rows := e.compete(ctx, e.opts.Warmup, e.opts.N, []string{OpReplicate}, fb, cp)
	var fbErr error
	for i := range rows {
		rows[i].DataMB = replicateMB
		if rows[i].System == SystemForkbox && rows[i].Error != "" {
			fbErr = errors.New(rows[i].Error)
		}
	}
	return append(rows, newResult(OpRestorePulled, SystemForkbox, pulled, fbErr),
		newResult(OpRestoreLocal, SystemForkbox, local, fbErr))
}

// randomHex is n random bytes in hex.
func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
