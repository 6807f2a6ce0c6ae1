package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon"
	"github.com/forkbox/forkbox/errdefs"
)

// TestDestroyWhileCreating proves a DELETE that arrives while the session
// is still being created ends it cleanly: the create answers "terminated"
// (not an internal error), the session ends with reason deleted, and
// nothing is left. (It used to tear the sandbox down under its creator's
// feet: runc failed with a 500, or the create went on to make a running
// sandbox no longer tracked.)
func TestDestroyWhileCreating(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 2*time.Minute)
	label := map[string]string{"test": "destroy-while-creating"}
	type result struct {
		s   *client.Session
		err error
	}
	done := make(chan result, 1)
	go func() {
		// A tiny CPU quota makes the agent take a second or more to start.
		s, _, err := env.c.CreateSession(ctx, client.CreateRequest{CPU: 0.01, Metadata: label}, "")
		done <- result{s, err}
	}()
	var id string
	for id == "" {
		select {
		case r := <-done:
			if r.err == nil {
				_ = env.c.DeleteSession(ctx, r.s.ID)
			}
			t.Skipf("the create ended (%v) before it could be destroyed", r.err)
		case <-time.After(5 * time.Millisecond):
		}
		ss, err := env.c.ListSessions(ctx, client.ListOptions{States: []string{"creating"}, Metadata: label})
		if err != nil {
			t.Fatal(err)
		}
		if len(ss) > 0 {
			id = ss[0].ID
		}
	}
	if err := env.c.DeleteSession(ctx, id); err != nil {
		t.Fatalf("delete a session being created: %v", err)
	}
	r := <-done
	if !errors.Is(r.err, errdefs.ErrTerminated) {
		t.Fatalf("create of a session deleted meanwhile: %+v, %v; want a terminated error", r.s, r.err)
	}
	got, err := env.c.GetSession(ctx, id)
	if err != nil || got.State != "terminated" || got.Reason != "deleted" {
		t.Fatalf("session after delete-while-creating: %+v %v", got, err)
	}
	assertGone(t, env.dataDir, id)
}

// TestSessionTimeoutDuringExec proves a command cut short by its session's
// end reports the session's end (410 terminated), in the event stream and
// as one JSON result, not a protocol error blamed on the request (it was a
// 400 "protocol error: incomplete envelope").
func TestSessionTimeoutDuringExec(t *testing.T) {
	need(t)
	for _, collect := range []bool{false, true} {
		s := newSession(t, client.CreateRequest{TimeoutS: 2})
		ctx := ctxFor(t, time.Minute)
		req := client.ExecRequest{Cmd: "echo started; sleep 30"}
		var err error
		if collect {
			_, err = env.c.ExecCollect(ctx, s.ID, req)
		} else {
			_, err = env.c.Exec(ctx, s.ID, req, nil, nil)
		}
		if !errors.Is(err, errdefs.ErrTerminated) || !strings.Contains(err.Error(), "timeout") {
			t.Errorf("exec (collect %v) when the session times out: %v, want terminated (timeout)", collect, err)
		}
	}
}

// TestExecCallerLeavesBeforeStart proves a foreground command is killed
// when its caller goes away before the command's start event came back (a
// slow sandbox makes that window long; a frozen one here). It used to keep
// running, unknown to the caller, until its own timeout (here an hour).
func TestExecCallerLeavesBeforeStart(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	ctx := ctxFor(t, 2*time.Minute)
	freezer := cgroupFile(t, "freezer", s.ID, "freezer.state")
	if err := os.WriteFile(freezer, []byte("FROZEN"), 0); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := env.c.Exec(short, s.ID, client.ExecRequest{Cmd: "sleep 3000 # abandoned", TimeoutS: 3600}, nil, nil)
		cancel()
		if err == nil {
			t.Fatal("exec returned before its command ended")
		}
	}
	if err := os.WriteFile(freezer, []byte("THAWED"), 0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // the agent reads the abandoned requests
	waitFor(t, func() bool {
		ps, err := env.c.Processes(ctx, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if len(p.Args) > 1 && strings.Contains(p.Args[1], "abandoned") {
				return false
			}
		}
		return true
	})
}

// ownDaemon is a daemon of a test's own, on a data directory that outlives
// restarts. Whatever happens in the test, its sessions are destroyed, the
// daemon is stopped and the directory removed at the end.
type ownDaemon struct {
	dataDir string
	key     string
	d       *daemon.Daemon
	c       *client.Client
	tune    func(*daemon.Options) // changes the test options at every start
}

func newOwnDaemon(t *testing.T) *ownDaemon { return newOwnDaemonWith(t, nil) }

// newOwnDaemonWith is newOwnDaemon with the options changed by tune.
func newOwnDaemonWith(t *testing.T, tune func(*daemon.Options)) *ownDaemon {
	t.Helper()
	need(t)
	tmp, err := os.MkdirTemp("", "forkbox-own-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(tmp, 0o711)
	o := &ownDaemon{dataDir: filepath.Join(tmp, "data"), tune: tune}
	t.Cleanup(func() {
		if o.d == nil && o.key != "" {
			// Stopped by a test that failed before it restarted it: its
			// sandboxes still run and must not outlive the directory.
			if d, err := startDaemonWith(o.dataDir, o.tune); err == nil {
				o.d, o.c = d, client.New(d.URL, o.key, nil)
			}
		}
		if o.d != nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if ss, err := o.c.ListSessions(ctx, client.ListOptions{}); err == nil {
				for _, s := range ss {
					_ = o.c.DeleteSession(ctx, s.ID)
					assertGone(t, o.dataDir, s.ID)
				}
			}
			o.d.Shutdown(ctx)
		}
		downDataDir(o.dataDir)
		os.RemoveAll(tmp)
	})
	o.start(t)
	return o
}

// start starts the daemon (again).
func (o *ownDaemon) start(t *testing.T) {
	t.Helper()
	d, err := startDaemonWith(o.dataDir, o.tune)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := os.ReadFile(d.KeyFile)
	o.d, o.key = d, strings.TrimSpace(string(key))
	o.c = client.New(d.URL, o.key, nil)
}

// restart shuts the daemon down (sandboxes keep running), runs between,
// and starts a new daemon on the same data directory.
func (o *ownDaemon) restart(t *testing.T, between func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := o.d.Shutdown(ctx)
	o.d = nil
	if err != nil {
		t.Fatal(err)
	}
	if between != nil {
		between()
	}
	o.start(t)
}

// TestRestartAdoptsSlowAgent proves a daemon restart keeps a sandbox whose
// agent is alive but slow to answer, as in a sandbox that starves itself of
// CPU (a small quota and busy processes; here the agent is stopped while
// the daemon restarts). It used to be destroyed, files and all, as "gone"
// when its agent did not answer /health within 3 s.
func TestRestartAdoptsSlowAgent(t *testing.T) {
	o := newOwnDaemon(t)
	ctx := ctxFor(t, 2*time.Minute)
	s, _, err := o.c.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.c.ExecCollect(ctx, s.ID, client.ExecRequest{Cmd: "echo precious > /home/user/work"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(o.dataDir, "sandboxes", s.ID, "init.pid"))
	if err != nil {
		t.Fatal(err)
	}
	initPid := strings.TrimSpace(string(b))
	o.restart(t, func() {
		if out, err := exec.Command("kill", "-STOP", initPid).CombinedOutput(); err != nil {
			t.Errorf("kill -STOP: %v %s", err, out)
		}
	})
	if out, err := exec.Command("kill", "-CONT", initPid).CombinedOutput(); err != nil {
		t.Fatalf("kill -CONT: %v %s", err, out)
	}
	got, err := o.c.GetSession(ctx, s.ID)
	if err != nil || got.State != "running" {
		t.Fatalf("sandbox with a slow agent after a restart: %+v %v, want running", got, err)
	}
	out, err := o.c.ExecCollect(ctx, s.ID, client.ExecRequest{Argv: []string{"cat", "/home/user/work"}})
	if err != nil || string(out.Stdout) != "precious\n" {
		t.Fatalf("exec in the adopted sandbox: %+v %v", out, err)
	}
}

// TestRestartThawsFrozenSandbox proves a sandbox left frozen by a daemon
// that died in the middle of an exec kill (freeze, signal, thaw) is thawed
// and adopted by the next daemon; it used to be destroyed as "gone".
func TestRestartThawsFrozenSandbox(t *testing.T) {
	o := newOwnDaemon(t)
	ctx := ctxFor(t, 2*time.Minute)
	s, _, err := o.c.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.c.ExecCollect(ctx, s.ID, client.ExecRequest{Cmd: "echo kept > /home/user/state"}); err != nil {
		t.Fatal(err)
	}
	o.restart(t, func() {
		freezer := cgroupFile(t, "freezer", s.ID, "freezer.state")
		if err := os.WriteFile(freezer, []byte("FROZEN"), 0); err != nil {
			t.Error(err)
		}
	})
	got, err := o.c.GetSession(ctx, s.ID)
	if err != nil || got.State != "running" {
		t.Fatalf("frozen sandbox after a restart: %+v %v, want running", got, err)
	}
	out, err := o.c.ExecCollect(ctx, s.ID, client.ExecRequest{Argv: []string{"cat", "/home/user/state"}})
	if err != nil || string(out.Stdout) != "kept\n" {
		t.Fatalf("exec in the thawed sandbox: %+v %v", out, err)
	}
}

// TestTemplateDeleteRacesCreate proves deleting a template while sessions
// are being created on it never fails a create with an internal error and
// never removes a template from under a live sandbox: each create either
// succeeds (and the delete is refused) or is told the template does not
// exist.
func TestTemplateDeleteRacesCreate(t *testing.T) {
	need(t)
	img := busyboxImage(t)
	ctx := ctxFor(t, 5*time.Minute)
	const name = "race-tpl"
	for i := 0; i < 8; i++ {
		if _, err := env.c.ImportTemplate(ctx, name, "", bytes.NewReader(img), int64(len(img))); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		var s *client.Session
		var createErr, deleteErr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			s, _, createErr = env.c.CreateSession(ctx, client.CreateRequest{Template: name}, "")
		}()
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(i) * time.Millisecond)
			deleteErr = env.c.DeleteTemplate(ctx, name)
		}()
		wg.Wait()
		switch {
		case createErr == nil:
			if deleteErr == nil {
				t.Fatalf("round %d: the template was deleted under live session %s", i, s.ID)
			}
			if !errors.Is(deleteErr, errdefs.ErrConflict) {
				t.Fatalf("round %d: delete of a template in use: %v, want conflict", i, deleteErr)
			}
			if out := sh(t, s.ID, "echo alive"); out != "alive\n" {
				t.Fatalf("round %d: session on the template: %q", i, out)
			}
			if err := env.c.DeleteSession(ctx, s.ID); err != nil {
				t.Fatal(err)
			}
			if err := env.c.DeleteTemplate(ctx, name); err != nil {
				t.Fatal(err)
			}
		case errors.Is(createErr, errdefs.ErrInvalidArgument):
			if deleteErr != nil {
				t.Fatalf("round %d: create refused (%v) but the delete failed too: %v", i, createErr, deleteErr)
			}
		default:
			t.Fatalf("round %d: create racing a template delete: %v (delete: %v)", i, createErr, deleteErr)
		}
	}
}

// TestFileNamesNotUTF8 proves a file whose name is not UTF-8 (any sandbox
// process can make one) does not break listing its directory, and that
// such a path in a request is a 400 naming the field, not a 503 from the
// envd protocol (whose strings must be UTF-8).
func TestFileNamesNotUTF8(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	sh(t, s.ID, `mkdir /tmp/odd && cd /tmp/odd && touch "$(printf 'bad\377name')" ok && ln -s "$(printf '\377')" link`)
	ctx := ctxFor(t, time.Minute)
	entries, err := env.c.ListDir(ctx, s.ID, "/tmp/odd", 1, "")
	if err != nil {
		t.Fatalf("list a directory holding a non-UTF-8 name: %v", err)
	}
	names := map[string]bool{}
	for _, e := range entries {
		names[e.Name] = true
	}
	if len(entries) != 3 || !names["ok"] || !names["bad\uFFFDname"] || !names["link"] {
		t.Fatalf("entries %+v", entries)
	}
	for _, r := range []struct{ method, path string }{
		{"GET", "/v1/sessions/" + s.ID + "/fs/stat?path=/tmp/odd/bad%FFname"},
		{"GET", "/v1/sessions/" + s.ID + "/fs/list?path=/tmp/%FF"},
		{"PUT", "/v1/sessions/" + s.ID + "/files/tmp/odd/new%FF"},
		{"DELETE", "/v1/sessions/" + s.ID + "/files/tmp/odd/bad%FFname"},
	} {
		code, _, body := rawRequest(t, r.method, r.path, "x", env.key, nil)
		var p client.Error
		_ = json.Unmarshal([]byte(body), &p)
		if code != 400 || p.Field != "path" {
			t.Errorf("%s %s: %d %s, want 400 naming path", r.method, r.path, code, body)
		}
	}
	// Downloads go over plain HTTP and can still fetch such a file.
	if got := download(t, s.ID, "/tmp/odd/bad\377name", ""); len(got) != 0 {
		t.Errorf("download of the empty file: %q", got)
	}
}

// TestProcessIDsOutOfRange proves a pid beyond Linux's range is refused
// instead of wrapping around (the agent's protocol has 32-bit pids, and
// 4294967297 used to name pid 1).
func TestProcessIDsOutOfRange(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	for _, pid := range []string{"4294967297", "4294967296", "99999999999"} {
		code, _, body := rawRequest(t, "DELETE", "/v1/sessions/"+s.ID+"/processes/"+pid, "", env.key, nil)
		var p client.Error
		_ = json.Unmarshal([]byte(body), &p)
		if code != 400 || p.Field != "pid" {
			t.Errorf("kill pid %s: %d %s, want 400 naming pid", pid, code, body)
		}
	}
	res, err := env.c.ExecCollect(ctxFor(t, time.Minute), s.ID, client.ExecRequest{Cmd: "id -u", User: "99999"})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Field != "user" {
		t.Errorf("exec as uid 99999 (outside the sandbox's ids): %+v %v, want 400 naming user", res, err)
	}
}

// TestExecAsUserWithoutHome proves a command run as a user whose home does
// not exist (nobody: /nonexistent) starts in / instead of failing with an
// error about a cwd the caller never gave.
func TestExecAsUserWithoutHome(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	res, out, errOut := run(t, s.ID, client.ExecRequest{Cmd: "pwd; id -un", User: "nobody"})
	if res.ExitCode != 0 || out != "/\nnobody\n" {
		t.Fatalf("exec as nobody: %+v %q %q", res, out, errOut)
	}
}

// TestIdempotentRetryAfterFailedCreate proves a create that failed does not
// keep its Idempotency-Key: a retry gets the same error again (not 200 with
// the failed session, as it used to), and the key can then be used for a
// create that works.
func TestIdempotentRetryAfterFailedCreate(t *testing.T) {
	need(t)
	ctx := ctxFor(t, time.Minute)
	key := "failed-create-" + time.Now().Format("150405.000000")
	bad := client.CreateRequest{User: "ghost"} // not in the template: fails after the sandbox started
	for i := 0; i < 2; i++ {
		s, replayed, err := env.c.CreateSession(ctx, bad, key)
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Field != "user" {
			t.Fatalf("attempt %d: %+v replayed=%v %v, want 400 naming user", i, s, replayed, err)
		}
	}
	s, replayed, err := env.c.CreateSession(ctx, client.CreateRequest{}, key)
	if err != nil || replayed {
		t.Fatalf("create with the released key: %v replayed=%v", err, replayed)
	}
	env.c.DeleteSession(ctx, s.ID)
}

// TestShutdownCutsExecStreams proves a daemon shutdown that runs out of
// time for an exec stream cuts it and kills its command (as when a client
// goes away), instead of leaving the command running unseen until its own
// timeout, and reports no error for it.
func TestShutdownCutsExecStreams(t *testing.T) {
	o := newOwnDaemon(t)
	ctx := ctxFor(t, 2*time.Minute)
	s, _, err := o.c.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		var once sync.Once
		_, err := o.c.Exec(ctx, s.ID, client.ExecRequest{Cmd: "echo up; sleep 300 # cut", TimeoutS: 600},
			writerFunc(func(p []byte) (int, error) { once.Do(func() { close(started) }); return len(p), nil }), nil)
		done <- err
	}()
	<-started
	shutdownCtx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err = o.d.Shutdown(shutdownCtx)
	o.d = nil
	if err != nil {
		t.Fatalf("shutdown with an exec stream running: %v", err)
	}
	if err := <-done; err == nil {
		t.Fatal("the cut exec stream reported success")
	}
	o.start(t)
	waitFor(t, func() bool {
		ps, err := o.c.Processes(ctx, s.ID)
		if err != nil {
			t.Fatal(err)
		}
		return len(ps) == 0
	})
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// TestExecStdinThenKeepStdin proves a command given both stdin data and
// keep_stdin gets the data first and keeps its stdin open for more (the
// data used to close it, so the first SendStdin found the command gone).
func TestExecStdinThenKeepStdin(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	ctx := ctxFor(t, time.Minute)
	pid, err := env.c.ExecBackground(ctx, s.ID, client.ExecRequest{
		Cmd: "cat > /tmp/in", Stdin: []byte("first\n"), KeepStdin: true})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the exec's own data is written by now
	if err := env.c.SendStdin(ctx, s.ID, pid, []byte("second\n"), true); err != nil {
		t.Fatalf("send stdin after the exec's own: %v", err)
	}
	waitFor(t, func() bool {
		ps, err := env.c.Processes(ctx, s.ID)
		return err == nil && len(ps) == 0
	})
	if got := string(download(t, s.ID, "/tmp/in", "")); got != "first\nsecond\n" {
		t.Fatalf("stdin as the command read it: %q", got)
	}
}

// TestDestroyWithoutRuncState proves destroy removes a sandbox's cgroups
// in every hierarchy, the unified (cgroup2) one of a hybrid host included,
// also when runc has no state for the sandbox: so it is after a `runc run`
// killed half-way, as when systemd kills a restarting daemon's whole
// cgroup. That directory used to stay forever.
func TestDestroyWithoutRuncState(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	if err := os.RemoveAll(filepath.Join(env.dataDir, "runc", s.ID)); err != nil {
		t.Fatal(err)
	}
	if err := env.c.DeleteSession(ctxFor(t, time.Minute), s.ID); err != nil {
		t.Fatal(err)
	}
	assertGone(t, env.dataDir, s.ID)
}
