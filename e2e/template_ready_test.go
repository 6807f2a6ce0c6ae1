package e2e

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// readyDockerfile builds on base a template whose start command serves
// /srv over HTTP on 127.0.0.1:8000 after a second's delay (so a create
// that did not wait would find nothing listening) and whose HEALTHCHECK,
// the template's ready check, fetches it.
const readyDockerfile = `FROM base
USER root
RUN mkdir -p /srv && echo served-by-the-start-command > /srv/index.html
USER user
CMD ["/bin/sh", "-c", "sleep 1; exec python3 -m http.server 8000 --bind 127.0.0.1 --directory /srv"]
HEALTHCHECK --start-period=30s CMD curl -fs http://127.0.0.1:8000/ > /dev/null
`

// TestTemplateReadyCheck proves a template with a start command and a
// ready check (a Dockerfile HEALTHCHECK) gives sessions whose create
// returns only once the server answers: an exec right after the create
// fetches the page at once. A fork of such a session's snapshot starts
// nothing again and does not wait. The template shows its ready check.
func TestTemplateReadyCheck(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 5*time.Minute)
	name := tplName("ready")
	deleteBuildSnapshotsAtEnd(t, env.c, name)
	res, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: readyDockerfile}, client.BuildOptions{})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	deleteTemplateAtEnd(t, env.c, name)
	wantReady := "/bin/sh -c curl -fs http://127.0.0.1:8000/ > /dev/null"
	if got := strings.Join(res.Template.ReadyCmd, " "); got != wantReady || res.Template.ReadyTimeoutS != 30 {
		t.Fatalf("built template's ready check %q (%d s), want %q (30 s)", got, res.Template.ReadyTimeoutS, wantReady)
	}
	got, err := env.c.Template(ctx, name)
	if err != nil || strings.Join(got.ReadyCmd, " ") != wantReady {
		t.Fatalf("GET the template: %+v, %v", got, err)
	}

	for i := 0; i < 2; i++ { // (the second create may take another path: a spare, a cold start)
		s := newSession(t, client.CreateRequest{Template: name})
		res, out, errOut := run(t, s.ID, client.ExecRequest{Cmd: "curl -fsS --max-time 5 http://127.0.0.1:8000/"})
		if res.ExitCode != 0 || out != "served-by-the-start-command\n" {
			t.Fatalf("create %d: right after it the server answers %d %q %q, want the page", i, res.ExitCode, out, errOut)
		}
		if !hasTag(t, s.ID, "start") {
			t.Fatalf("create %d: the start command is not running", i)
		}
		if i == 1 {
			// A fork of a snapshot of the running session: the files, not
			// the start command again (runc keeps no processes).
			snap, err := env.c.Snapshot(ctx, s.ID, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = env.c.DeleteSnapshot(ctxFor(t, time.Minute), snap.ID, true) })
			f := newSession(t, client.CreateRequest{Snapshot: snap.ID})
			if hasTag(t, f.ID, "start") {
				t.Error("a session from a snapshot ran the template's start command again")
			}
			if out := sh(t, f.ID, "cat /srv/index.html"); out != "served-by-the-start-command\n" {
				t.Errorf("the fork's files: %q", out)
			}
		}
	}
}

// TestTemplateReadyCheckGVisor proves the ready check holds a gVisor
// create too (the start command runs at each create there as well), and
// that a session restored from a memory snapshot of such a session has
// the server running at once without the start command run again (the
// restored process answers: the checkpoint held it).
func TestTemplateReadyCheckGVisor(t *testing.T) {
	needGVisor(t)
	ctx := ctxFor(t, 5*time.Minute)
	name := tplName("ready-gv")
	deleteBuildSnapshotsAtEnd(t, env.c, name)
	if _, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: readyDockerfile}, client.BuildOptions{}); err != nil {
		t.Fatalf("build: %v", err)
	}
	deleteTemplateAtEnd(t, env.c, name)
	s := newSession(t, client.CreateRequest{Template: name, Isolation: "gvisor"})
	fetch := "curl -fsS --max-time 5 http://127.0.0.1:8000/"
	if res, out, errOut := run(t, s.ID, client.ExecRequest{Cmd: fetch}); res.ExitCode != 0 || out != "served-by-the-start-command\n" {
		t.Fatalf("right after a gVisor create the server answers %d %q %q, want the page", res.ExitCode, out, errOut)
	}
	sn, err := env.c.SnapshotWith(ctx, s.ID, client.SnapshotRequest{Memory: true})
	if err != nil {
		t.Fatalf("memory snapshot: %v", err)
	}
	t.Cleanup(func() { _ = env.c.DeleteSnapshot(ctxFor(t, time.Minute), sn.ID, true) })
	clone := newSession(t, client.CreateRequest{Snapshot: sn.ID})
	if res, out, errOut := run(t, clone.ID, client.ExecRequest{Cmd: fetch}); res.ExitCode != 0 || out != "served-by-the-start-command\n" {
		t.Fatalf("right after a restore the server answers %d %q %q, want the page", res.ExitCode, out, errOut)
	}
	if got := sh(t, clone.ID, "pgrep -f -c '[h]ttp.server 8000'"); got != "1\n" {
		t.Fatalf("servers in the restored session: %q, want the one restored (the start command not run again)", got)
	}
}

// TestTemplateReadyCheckFails proves a ready check that never passes
// fails the create with the 422 ready-check-failed naming the check and
// its last output, and leaves no session (cold or spare start, and a
// create served by the template's warm pool), and that bad ready_cmd or
// ready_timeout_s values are a 400 naming the field.
func TestTemplateReadyCheckFails(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 5*time.Minute)
	name := tplName("never-ready")
	deleteBuildSnapshotsAtEnd(t, env.c, name)
	never := "echo not-listening-yet >&2; exit 7"
	res, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{
		Dockerfile: "FROM base\nCMD [\"/bin/sh\", \"-c\", \"exec sleep 100000\"]\n",
		ReadyCmd:   &never, ReadyTimeoutS: 2}, client.BuildOptions{})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	deleteTemplateAtEnd(t, env.c, name)
	if res.Template.ReadyTimeoutS != 2 || len(res.Template.ReadyCmd) != 3 || res.Template.ReadyCmd[2] != never {
		t.Fatalf("built template %+v", res.Template)
	}

	failCreate := func(label string, req client.CreateRequest) string {
		t.Helper()
		req.Template = name
		req.Metadata = map[string]string{"ready-test": label}
		_, _, err := env.c.CreateSession(ctx, req, "")
		if problemStatus(err) != http.StatusUnprocessableEntity || errProblem(err) != "ready-check-failed" ||
			!strings.Contains(err.Error(), never) || !strings.Contains(err.Error(), "not-listening-yet") ||
			!strings.Contains(err.Error(), "exit code 7") {
			t.Fatalf("%s: create: %v, want 422 ready-check-failed naming the check and its last output", label, err)
		}
		t.Logf("%s: %v", label, err)
		all, err := env.c.ListSessions(ctx, client.ListOptions{All: true, Metadata: req.Metadata})
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 1 || all[0].State != "terminated" {
			t.Fatalf("%s: the failed create's sessions: %+v, want one, terminated", label, all)
		}
		if _, err := os.Stat(filepath.Join(env.dataDir, "sandboxes", all[0].ID)); !os.IsNotExist(err) {
			t.Fatalf("%s: the failed session's sandbox is still on the host (%v)", label, err)
		}
		return all[0].ID
	}
	failCreate("plain", client.CreateRequest{})

	// A check that hangs: the wait ends it, the create fails as soon as
	// the wait is over and says so.
	hang, hangs := tplName("hang-ready"), "sleep 1000"
	deleteBuildSnapshotsAtEnd(t, env.c, hang)
	if _, err := env.c.BuildTemplate(ctx, hang, client.BuildRequest{Dockerfile: "FROM base\n", ReadyCmd: &hangs, ReadyTimeoutS: 1},
		client.BuildOptions{}); err != nil {
		t.Fatalf("build: %v", err)
	}
	deleteTemplateAtEnd(t, env.c, hang)
	hangMeta := map[string]string{"ready-test": "hang"}
	_, _, err = env.c.CreateSession(ctx, client.CreateRequest{Template: hang, Metadata: hangMeta}, "")
	if errProblem(err) != "ready-check-failed" || !strings.Contains(err.Error(), "still running when the wait ended") {
		t.Fatalf("a hanging ready check: %v, want ready-check-failed saying the try was still running", err)
	}
	if live, _ := env.c.ListSessions(ctx, client.ListOptions{Metadata: hangMeta}); len(live) != 0 {
		t.Fatalf("a hanging ready check left sessions: %+v", live)
	}

	// Through the template's warm pool: the member the create takes is
	// destroyed with it, and the pool makes another.
	const cpu = 0.65 // limits no other test asks for
	if _, err := env.c.SetPool(ctx, client.Pool{Template: name, Size: 1, CPU: cpu}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = env.c.SetPool(ctxFor(t, time.Minute), client.Pool{Template: name, Size: 0}) })
	poolReady := func() bool {
		ps, err := env.c.Pools(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range ps {
			if p.Template == name && p.CPU == cpu {
				return p.Ready == 1
			}
		}
		return false
	}
	waitFor(t, poolReady)
	before := poolMembers(t)
	id := failCreate("pooled", client.CreateRequest{CPU: cpu})
	found := false
	for _, m := range before {
		found = found || m == id
	}
	if !found {
		t.Errorf("the pooled create's session %s was no pool member (%v)", id, before)
	}
	waitFor(t, poolReady)
	if _, err := env.c.SetPool(ctx, client.Pool{Template: name, Size: 0}); err != nil {
		t.Fatal(err)
	}
	// The template goes once the pool's member is gone (it holds it).
	waitFor(t, func() bool { return env.c.DeleteTemplate(ctx, name) == nil })

	// Bad input: a 400 naming the field, before anything is built.
	empty, long := "", strings.Repeat("x", 4097)
	for _, c := range []struct {
		req   client.BuildRequest
		field string
	}{
		{client.BuildRequest{Dockerfile: "FROM base\n", ReadyCmd: &empty}, "ready_cmd"},
		{client.BuildRequest{Dockerfile: "FROM base\n", ReadyCmd: &long}, "ready_cmd"},
		{client.BuildRequest{Dockerfile: "FROM base\n", ReadyTimeoutS: 601}, "ready_timeout_s"},
		{client.BuildRequest{Dockerfile: "FROM base\nHEALTHCHECK CMD " + long + "\n"}, "dockerfile"},
	} {
		_, err := env.c.BuildTemplate(ctx, tplName("bad-ready"), c.req, client.BuildOptions{})
		if problemStatus(err) != http.StatusBadRequest || problemField(err) != c.field {
			t.Errorf("build %+.60v: %v, want a 400 naming %s", c.req, err, c.field)
		}
	}
}

// problemField is the field a client error's problem names ("" for none).
func problemField(err error) string {
	var ce *client.Error
	if errors.As(err, &ce) {
		return ce.Field
	}
	return ""
}

// TestTemplateReadyCheckSpare proves the ready check holds a create that
// takes a spare: the server answers right after it, and a check that
// never passes fails the spare-made session, which is destroyed.
func TestTemplateReadyCheckSpare(t *testing.T) {
	o := spareDaemon(t, 2)
	ctx := ctxFor(t, 5*time.Minute)
	name, never := tplName("ready-spare"), tplName("never-spare")
	for _, n := range []string{name, never} {
		deleteBuildSnapshotsAtEnd(t, o.c, n)
	}
	if _, err := o.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: readyDockerfile}, client.BuildOptions{}); err != nil {
		t.Fatalf("build: %v", err)
	}
	deleteTemplateAtEnd(t, o.c, name)
	fail := "exit 9"
	if _, err := o.c.BuildTemplate(ctx, never, client.BuildRequest{Dockerfile: "FROM base\n", ReadyCmd: &fail, ReadyTimeoutS: 1},
		client.BuildOptions{}); err != nil {
		t.Fatalf("build: %v", err)
	}
	deleteTemplateAtEnd(t, o.c, never)
	waitSpares(t, o, 2)

	before := spareCreates(t, o)
	s, _, err := o.c.CreateSession(ctx, client.CreateRequest{Template: name}, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.c.DeleteSession(ctxFor(t, time.Minute), s.ID) })
	if got := spareCreates(t, o); got != before+1 {
		t.Fatalf("the create did not take a spare (%v spare creates, were %v)", got, before)
	}
	if got := clientSh(t, o.c, s.ID, "curl -fsS --max-time 5 http://127.0.0.1:8000/"); got != "served-by-the-start-command\n" {
		t.Fatalf("right after a create from a spare: %q", got)
	}

	waitSpares(t, o, 1)
	before = spareCreates(t, o)
	meta := map[string]string{"ready-test": "spare"}
	_, _, err = o.c.CreateSession(ctx, client.CreateRequest{Template: never, Metadata: meta}, "")
	if errProblem(err) != "ready-check-failed" || !strings.Contains(err.Error(), "exit code 9") {
		t.Fatalf("a never-ready create from a spare: %v, want ready-check-failed", err)
	}
	if got := spareCreates(t, o); got != before+1 {
		t.Fatalf("the failing create did not take a spare (%v spare creates, were %v)", got, before)
	}
	all, err := o.c.ListSessions(ctx, client.ListOptions{All: true, Metadata: meta})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].State != "terminated" {
		t.Fatalf("the failed create's sessions: %+v, want one, terminated", all)
	}
	if _, err := os.Stat(filepath.Join(o.dataDir, "sandboxes", all[0].ID)); !os.IsNotExist(err) {
		t.Fatalf("the failed session's sandbox is still on the host (%v)", err)
	}
}

// TestTemplateReadyCheckIdempotent proves a create retried with the same
// Idempotency-Key while the first waits for the template's ready check
// gets the session only once it is ready, and that a retry of a create
// whose ready check failed fails again (the session is gone), never
// handing out a session that did not pass the check.
func TestTemplateReadyCheckIdempotent(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 5*time.Minute)
	name := tplName("ready-idem")
	deleteBuildSnapshotsAtEnd(t, env.c, name)
	check := "test -f /tmp/ready"
	if _, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{ReadyCmd: &check, ReadyTimeoutS: 20,
		Dockerfile: "FROM base\nCMD [\"/bin/sh\", \"-c\", \"sleep 3; touch /tmp/ready; exec sleep 100000\"]\n"},
		client.BuildOptions{}); err != nil {
		t.Fatalf("build: %v", err)
	}
	deleteTemplateAtEnd(t, env.c, name)
	key := "ready-idem-" + name
	first := make(chan error, 1)
	go func() {
		s, _, err := env.c.CreateSession(ctx, client.CreateRequest{Template: name}, key)
		if err == nil {
			t.Cleanup(func() { _ = env.c.DeleteSession(ctxFor(t, time.Minute), s.ID) })
		}
		first <- err
	}()
	time.Sleep(1500 * time.Millisecond)
	s, _, err := env.c.CreateSession(ctx, client.CreateRequest{Template: name}, key)
	if err != nil {
		t.Fatalf("the retry: %v", err)
	}
	if r, _, errOut := run(t, s.ID, client.ExecRequest{Cmd: check}); r.ExitCode != 0 {
		t.Errorf("the retry during the ready wait returned session %s before its check passed (%d %q)", s.ID, r.ExitCode, errOut)
	}
	if err := <-first; err != nil {
		t.Fatalf("the first create: %v", err)
	}

	never := tplName("ready-idem-never")
	deleteBuildSnapshotsAtEnd(t, env.c, never)
	fails := "exit 3"
	if _, err := env.c.BuildTemplate(ctx, never, client.BuildRequest{Dockerfile: "FROM base\n", ReadyCmd: &fails, ReadyTimeoutS: 1},
		client.BuildOptions{}); err != nil {
		t.Fatalf("build: %v", err)
	}
	deleteTemplateAtEnd(t, env.c, never)
	for i := 0; i < 2; i++ {
		s, _, err := env.c.CreateSession(ctx, client.CreateRequest{Template: never}, "ready-idem-never-"+never)
		if errProblem(err) != "ready-check-failed" {
			t.Fatalf("create %d with the same key of a never-ready template: %+v, %v, want ready-check-failed", i, s, err)
		}
	}
}

// TestTemplateReadyCheckRestart proves a daemon shut down while a create
// waits for its template's ready check leaves no session behind: the
// create fails and, after the restart, no session of the template runs.
func TestTemplateReadyCheckRestart(t *testing.T) {
	o := newOwnDaemon(t)
	ctx := ctxFor(t, 3*time.Minute)
	name := tplName("ready-restart")
	never := "exit 1"
	if _, err := o.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: "FROM base\nCMD [\"sleep\", \"100000\"]\n",
		ReadyCmd: &never, ReadyTimeoutS: 60}, client.BuildOptions{}); err != nil {
		t.Fatalf("build: %v", err)
	}
	t.Cleanup(func() { _ = o.c.DeleteTemplate(ctxFor(t, time.Minute), name) })
	done := make(chan error, 1)
	c := o.c
	go func() {
		_, _, err := c.CreateSession(ctx, client.CreateRequest{Template: name}, "")
		done <- err
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ss, err := o.c.ListSessions(ctx, client.ListOptions{})
		if err == nil && len(ss) == 1 && ss[0].State == "running" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the create's session did not appear: %+v %v", ss, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	o.restart(t, func() {
		if err := <-done; err == nil {
			t.Error("a create whose ready check never passed succeeded across a shutdown")
		}
	})
	ss, err := o.c.ListSessions(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range ss {
		t.Errorf("after the restart, session %s (%s) of the create that never got ready is still live", s.ID, s.State)
	}
}
