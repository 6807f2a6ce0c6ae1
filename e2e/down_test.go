package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/internal/testport"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
)

// served is a `forkbox serve` process of a test, on a data directory of
// its own.
type served struct {
	dataDir string
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has exited (err is then set)
	err     error
	c       *client.Client
	log     *bytes.Buffer
}

// newDataDir returns a fresh data directory that sandboxes can traverse
// to, removed (after a last forkbox down, should the test have failed
// before its own) when t ends.
func newDataDir(t *testing.T) string {
	t.Helper()
	tmp, err := os.MkdirTemp("", "forkbox-down-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(tmp, 0o711)
	dir := filepath.Join(tmp, "data")
	t.Cleanup(func() {
		_ = exec.Command(env.cli, "down", "--data-dir", dir).Run()
		os.RemoveAll(tmp)
	})
	return dir
}

// serve starts the forkbox binary's daemon on dataDir with extra flags and
// waits until its API answers.
func serve(t *testing.T, dataDir string, extra ...string) *served {
	t.Helper()
	need(t)
	addr := testport.Addr(t)
	args := append([]string{"serve", "--data-dir", dataDir, "--listen", addr, "--agent", env.agent,
		"--storage-size", "3", "--log-level", "warn"}, extra...)
	if kind := os.Getenv("FORKBOX_STORAGE"); kind != "" {
		args = append(args, "--storage", kind)
	}
	s := &served{dataDir: dataDir, cmd: exec.Command(env.cli, args...), log: &bytes.Buffer{}, exited: make(chan struct{})}
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.err = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		select {
		case <-s.exited:
		default:
			s.cmd.Process.Signal(syscall.SIGTERM)
			<-s.exited
		}
	})
	layout := datadir.Layout{Root: dataDir}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if key, err := os.ReadFile(layout.APIKey()); err == nil {
			s.c = client.New("http://"+addr, strings.TrimSpace(string(key)), nil)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err = s.c.Info(ctx)
			cancel()
			if err == nil {
				return s
			}
		}
		select {
		case <-s.exited:
			t.Fatalf("forkbox serve exited (%v) before it served:\n%s", s.err, s.log)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("forkbox serve did not come up:\n%s", s.log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for the daemon to exit (a hang guard of 5
// minutes); it fails the test unless it exits 0.
func (s *served) stop(t *testing.T) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.exited:
		if s.err != nil {
			t.Fatalf("forkbox serve exited: %v\n%s", s.err, s.log)
		}
	case <-time.After(5 * time.Minute):
		s.cmd.Process.Kill()
		t.Fatalf("forkbox serve did not stop:\n%s", s.log)
	}
}

// makeSessions creates, through s, a session, one with a network and (when
// runsc is installed) a gVisor one, and a warm pool of one; it returns the
// sessions' ids once the pool member is ready.
func (s *served) makeSessions(t *testing.T) []string {
	t.Helper()
	ctx := ctxFor(t, 3*time.Minute)
	reqs := []client.CreateRequest{{}, {Network: &client.Network{Allow: []string{"example.test:443"}}}}
	if _, err := exec.LookPath("runsc"); err == nil {
		reqs = append(reqs, client.CreateRequest{Isolation: "gvisor"})
	}
	var ids []string
	for _, req := range reqs {
		sess, _, err := s.c.CreateSession(ctx, req, "")
		if err != nil {
			t.Fatalf("create %+v: %v\n%s", req, err, s.log)
		}
		ids = append(ids, sess.ID)
	}
	if _, err := s.c.SetPool(ctx, client.Pool{Template: "base", Size: 1, CPU: 0.25, MemoryMB: 96, Pids: 64, DiskMB: 64}); err != nil {
		t.Fatal(err)
	}
	waitForLong(t, 2*time.Minute, func() bool {
		ps, err := s.c.Pools(ctx)
		return err == nil && len(ps) == 1 && ps[0].Ready == 1
	})
	return ids
}

// hostLeftovers lists what of dataDir's daemon is still on the host:
// mounts under it, loop devices on its files (losetup -l), cgroups of its
// sandboxes or its cgroup parent, its nftables table, sandbox links and
// network namespace files, runc containers.
func hostLeftovers(t *testing.T, dataDir string, ids []string) []string {
	t.Helper()
	var out []string
	mounts, _ := os.ReadFile("/proc/mounts")
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], dataDir) {
			out = append(out, "mount "+f[1])
		}
	}
	losetup, err := exec.Command("losetup", "-l", "-n", "-O", "NAME,BACK-FILE").CombinedOutput()
	if err != nil {
		t.Fatalf("losetup -l: %v: %s", err, losetup)
	}
	for _, line := range strings.Split(string(losetup), "\n") {
		if strings.Contains(line, dataDir) {
			out = append(out, "loop device "+strings.TrimSpace(line))
		}
	}
	names := datadir.Layout{Root: dataDir}.HostNames()
	for _, id := range ids {
		for _, d := range cgroupDirs("*", id) {
			out = append(out, "cgroup "+d)
		}
		if _, err := os.Stat("/sys/class/net/" + netpolicy.HostLinkName(id)); err == nil {
			out = append(out, "link "+netpolicy.HostLinkName(id))
		}
	}
	if dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + names.CgroupParent); len(dirs) > 0 {
		out = append(out, fmt.Sprintf("cgroup parent %v", dirs))
	}
	if _, ok := hostTable(t, names.NftTable); ok {
		out = append(out, "nftables table "+names.NftTable)
	}
	if ns, _ := os.ReadDir(filepath.Join(dataDir, "netns")); len(ns) > 0 {
		out = append(out, fmt.Sprintf("%d network namespace files", len(ns)))
	}
	if rs, _ := os.ReadDir(filepath.Join(dataDir, "runc")); len(rs) > 0 {
		out = append(out, fmt.Sprintf("%d runc containers", len(rs)))
	}
	return out
}

// endedRecords checks dataDir's database: every session ids names ended
// with reason deleted and a detail containing detail.
func endedRecords(t *testing.T, dataDir string, ids []string, detail string) {
	t.Helper()
	st, err := store.Open(context.Background(), datadir.Layout{Root: dataDir}.Database())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, id := range ids {
		rec, err := st.GetSession(context.Background(), id)
		if err != nil || rec.State != node.StateTerminated || rec.Reason != node.ReasonDeleted || !strings.Contains(rec.Detail, detail) {
			t.Errorf("record of %s: %+v %v, want terminated, deleted, %q", id, rec, err, detail)
		}
	}
	live, err := st.ListSessions(context.Background(), node.SessionFilter{States: []node.State{node.StateCreating,
		node.StateRunning, node.StatePaused, node.StateTerminating, node.StatePooled}})
	if err != nil || len(live) > 0 {
		t.Errorf("sessions left in the database: %d %v", len(live), err)
	}
}

// TestServeStopSessions: `forkbox serve --stop-sessions` destroys every
// session (runc, with a network, gVisor) and its warm pool's member when
// it stops, and leaves nothing on the host: no mount, no loop device, no
// cgroup, no nftables table, link or namespace.
func TestServeStopSessions(t *testing.T) {
	dir := newDataDir(t)
	s := serve(t, dir, "--stop-sessions")
	ids := s.makeSessions(t)
	if left := hostLeftovers(t, dir, ids); len(left) == 0 {
		t.Fatal("the running daemon has nothing on the host (the check sees nothing)")
	}
	s.stop(t)
	if left := hostLeftovers(t, dir, ids); len(left) > 0 {
		t.Errorf("left on the host after serve --stop-sessions stopped: %v\n%s", left, s.log)
	}
	endedRecords(t, dir, ids, "--stop-sessions")
}

// TestDown: a daemon stopped without --stop-sessions leaves its sandboxes
// running and its storage mounted (by design: the next one adopts them);
// `forkbox down --data-dir` refuses while a daemon runs there, and with
// none it destroys them all and releases the host. A second down finds
// nothing to do, and a new serve on the directory starts from it.
func TestDown(t *testing.T) {
	dir := newDataDir(t)
	s := serve(t, dir)
	ids := s.makeSessions(t)
	down := func() (string, int) {
		cmd := exec.Command(env.cli, "down", "--data-dir", dir)
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return string(out), 0
	}
	if out, code := down(); code == 0 || !strings.Contains(out, "daemon runs on") {
		t.Fatalf("down while serve runs: exit %d: %s", code, out)
	}
	s.stop(t)
	left := hostLeftovers(t, dir, ids)
	if !strings.Contains(fmt.Sprint(left), "mount ") || !strings.Contains(fmt.Sprint(left), "cgroup ") {
		t.Fatalf("a stopped daemon left its sandboxes and storage? %v", left)
	}
	out, code := down()
	if code != 0 {
		t.Fatalf("forkbox down: exit %d: %s", code, out)
	}
	t.Logf("forkbox down: %s", strings.TrimSpace(out))
	if left := hostLeftovers(t, dir, ids); len(left) > 0 {
		t.Errorf("left on the host after forkbox down: %v\n%s", left, out)
	}
	endedRecords(t, dir, ids, "forkbox down")
	if out, code := down(); code != 0 || !strings.Contains(out, " 0 sandboxes") {
		t.Errorf("second down: exit %d: %s", code, out)
	}
	s2 := serve(t, dir)
	if ss, err := s2.c.ListSessions(ctxFor(t, time.Minute), client.ListOptions{}); err != nil || len(ss) != 0 {
		t.Errorf("sessions after down and a new serve: %+v %v", ss, err)
	}
	s2.stop(t)
}

// TestDownLostSandboxes: sandboxes whose records are lost (the database
// and runtime state deleted after the daemon stopped, as a half-done rm -rf
// of the data directory leaves them) are still taken down by forkbox down:
// what is in the daemon's cgroups is killed, their networks and mounts go,
// and so do the storage mount and loop device.
func TestDownLostSandboxes(t *testing.T) {
	dir := newDataDir(t)
	s := serve(t, dir)
	ids := s.makeSessions(t)
	s.stop(t)
	for _, p := range []string{"forkbox.db", "forkbox.db-wal", "forkbox.db-shm", "runc", "runsc"} {
		if err := os.RemoveAll(filepath.Join(dir, p)); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command(env.cli, "down", "--data-dir", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("forkbox down: %v: %s", err, out)
	}
	t.Logf("forkbox down: %s", strings.TrimSpace(string(out)))
	if left := hostLeftovers(t, dir, ids); len(left) > 0 {
		t.Errorf("left on the host after forkbox down: %v", left)
	}
}
