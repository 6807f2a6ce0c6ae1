package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/testnet"
)

// buildDockerfile is the multi-step Dockerfile TestTemplateBuild builds
// FROM template base (a busybox image): a COPY from the context, a RUN
// as root writing into /usr/local and the user's home, ENV, WORKDIR,
// USER, a RUN as that user, and a start command. last replaces its last
// RUN's command.
func buildDockerfile(base, last string) string {
	return `FROM ` + base + `
ENV GREETING=hello APP_HOME=/opt/app
WORKDIR /opt/app
COPY hello.txt ./
RUN busybox mkdir -p /usr/local/share && echo "tool $GREETING" > /usr/local/share/tool.txt && echo made-by-root > /home/user/from-root && busybox chown 1000:1000 /home/user/from-root
USER user
RUN ` + last + `
CMD ["/bin/sh", "-c", "echo started > /tmp/started; exec busybox sleep 100000"]
`
}

// buildContext writes a build context directory holding hello.txt.
func buildContext(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("hello from the context\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// buildSessions lists the sessions (live or ended) a build of name made.
func buildSessions(t *testing.T, name string) []client.Session {
	t.Helper()
	ss, err := env.c.ListSessions(ctxFor(t, time.Minute), client.ListOptions{All: true, Metadata: map[string]string{"forkbox.build": name}})
	if err != nil {
		t.Fatal(err)
	}
	return ss
}

// TestTemplateBuild proves a Dockerfile becomes a template whose
// sessions have the COPY's file, what the RUNs wrote (in /usr/local and
// the home directory), the ENV, the WORKDIR, the USER and the running
// start command; that a rebuild of the same Dockerfile is fully cached
// and makes no sandbox; that a change of the last step reruns only it;
// that a failing RUN fails the build with its exit code and output and
// registers nothing; and that a second build of a name being built is
// a conflict.
func TestTemplateBuild(t *testing.T) {
	need(t)
	img := busyboxImage(t)
	ctx := ctxFor(t, 10*time.Minute)
	base := tplName("bb-build")
	if _, err := env.c.ImportTemplate(ctx, base, "", bytes.NewReader(img), int64(len(img))); err != nil {
		t.Fatal(err)
	}
	deleteTemplateAtEnd(t, env.c, base)
	dir := buildContext(t)
	lastRun := `echo "$GREETING from $(id -u) in $(pwd)" > /home/user/as-user`
	df := buildDockerfile(base, lastRun)

	name := tplName("built")
	deleteTemplateAtEnd(t, env.c, name)
	deleteBuildSnapshotsAtEnd(t, env.c, name)
	var events []client.BuildEvent
	res, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: df},
		client.BuildOptions{ContextDir: dir, Progress: func(e client.BuildEvent) { events = append(events, e) }})
	if err != nil {
		t.Fatalf("build: %v", err)
	}
	if len(res.Steps) != 7 || res.Sandboxes != 1 || res.Template.Name != name || res.Template.Source != "build" {
		t.Fatalf("build result %+v", res)
	}
	for _, s := range res.Steps {
		if s.Cached {
			t.Errorf("first build: step %d (%s) cached", s.Step, s.Instruction)
		}
	}
	if n := countEvents(events, "step"); n != 7 || countEvents(events, "done") != 7 {
		t.Errorf("first build: %d step events (%+v)", n, events)
	}
	if got := buildSessions(t, name); len(got) != 1 || got[0].State != "terminated" {
		t.Errorf("the build's sandboxes: %+v, want one, ended", got)
	}
	if strings.Join(res.Template.StartCmd, " ") == "" || res.Template.User != "user" || res.Template.Workdir != "/opt/app" {
		t.Errorf("built template %+v", res.Template)
	}

	s := newSession(t, client.CreateRequest{Template: name})
	out := sh(t, s.ID, `echo $GREETING $APP_HOME; id -u; pwd; cat hello.txt /usr/local/share/tool.txt /home/user/from-root /home/user/as-user`)
	want := "hello /opt/app\n1000\n/opt/app\nhello from the context\ntool hello\nmade-by-root\nhello from 1000 in /opt/app\n"
	if out != want {
		t.Fatalf("in a session of the built template:\n%s\nwant:\n%s", out, want)
	}
	if !hasTag(t, s.ID, "start") {
		t.Error("the start command (CMD) is not running in the session")
	}

	// The same Dockerfile again: every step cached, no sandbox made.
	again := tplName("built-again")
	deleteTemplateAtEnd(t, env.c, again)
	res2, err := env.c.BuildTemplate(ctx, again, client.BuildRequest{Dockerfile: df}, client.BuildOptions{ContextDir: dir})
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	for _, st := range res2.Steps {
		if !st.Cached {
			t.Errorf("rebuild: step %d (%s) not cached", st.Step, st.Instruction)
		}
	}
	if res2.Sandboxes != 0 || len(buildSessions(t, again)) != 0 {
		t.Errorf("a fully cached rebuild made sandboxes: %d, %+v", res2.Sandboxes, buildSessions(t, again))
	}
	s2 := newSession(t, client.CreateRequest{Template: again})
	if out := sh(t, s2.ID, "cat /home/user/as-user /usr/local/share/tool.txt"); out != "hello from 1000 in /opt/app\ntool hello\n" {
		t.Errorf("the cached build's files: %q", out)
	}

	// A change in the last RUN: only it runs again.
	changed := tplName("built-changed")
	deleteTemplateAtEnd(t, env.c, changed)
	deleteBuildSnapshotsAtEnd(t, env.c, changed)
	res3, err := env.c.BuildTemplate(ctx, changed, client.BuildRequest{Dockerfile: buildDockerfile(base, `echo changed > /home/user/as-user`)},
		client.BuildOptions{ContextDir: dir})
	if err != nil {
		t.Fatalf("changed build: %v", err)
	}
	for _, st := range res3.Steps {
		rerun := st.Step >= 6 // the last RUN, and the CMD after it
		if st.Cached == rerun {
			t.Errorf("changed build: step %d (%s) cached=%v", st.Step, st.Instruction, st.Cached)
		}
	}
	if res3.Sandboxes != 1 {
		t.Errorf("changed build made %d sandboxes, want 1", res3.Sandboxes)
	}
	s3 := newSession(t, client.CreateRequest{Template: changed})
	if out := sh(t, s3.ID, "cat /home/user/as-user hello.txt"); out != "changed\nhello from the context\n" {
		t.Errorf("the changed build's files: %q", out)
	}
	wantNoPartials(t)
}

// TestTemplateBuildFailures proves a RUN that exits non-zero fails the
// build with its exit code and last output and registers nothing, that
// an unsupported instruction is a 400 naming its line, and that a
// second build of a name being built is a conflict.
func TestTemplateBuildFailures(t *testing.T) {
	need(t)
	img := busyboxImage(t)
	ctx := ctxFor(t, 5*time.Minute)
	base := tplName("bb-fail")
	if _, err := env.c.ImportTemplate(ctx, base, "", bytes.NewReader(img), int64(len(img))); err != nil {
		t.Fatal(err)
	}
	deleteTemplateAtEnd(t, env.c, base)

	name := tplName("fails")
	deleteBuildSnapshotsAtEnd(t, env.c, name)
	var failed *client.BuildEvent
	_, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: "FROM " + base + "\nENV A=1\nRUN echo boom-on-stderr >&2; exit 7\nCMD [\"true\"]\n"},
		client.BuildOptions{Progress: func(e client.BuildEvent) {
			if e.Kind == "failed" {
				failed = &e
			}
		}})
	if errProblem(err) != "build-step-failed" || problemStatus(err) != 422 || !strings.Contains(err.Error(), "exited 7") ||
		!strings.Contains(err.Error(), "boom-on-stderr") || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("a failing RUN: %v, want build-step-failed naming exit 7, line 3 and its output", err)
	}
	if failed == nil || failed.ExitCode != 7 || failed.Step != 2 {
		t.Errorf("failed event %+v, want step 2 exit 7", failed)
	}
	if ts, _ := env.c.Templates(ctx); hasTemplate(ts, name) {
		t.Error("a failed build registered its template")
	}
	if got := buildSessions(t, name); len(got) != 1 || got[0].State != "terminated" {
		t.Errorf("the failed build's sandboxes: %+v, want one, ended", got)
	}
	wantNoPartials(t)

	_, err = env.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: "FROM " + base + "\nRUN true\nSTOPSIGNAL SIGKILL\n"}, client.BuildOptions{})
	if problemStatus(err) != 400 || !strings.Contains(err.Error(), "line 3") || !strings.Contains(err.Error(), "STOPSIGNAL") {
		t.Errorf("an unsupported instruction: %v, want a 400 naming line 3", err)
	}

	// A build holds its name: a second one at once is a conflict.
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	running := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		var once bool
		_, err := env.c.BuildTemplate(bctx, name, client.BuildRequest{Dockerfile: "FROM " + base + "\nRUN busybox sleep 600\n"},
			client.BuildOptions{Progress: func(e client.BuildEvent) {
				if e.Kind == "step" && !once {
					once = true
					close(running)
				}
			}})
		done <- err
	}()
	select {
	case <-running:
	case err := <-done:
		t.Fatalf("the long build ended: %v", err)
	}
	_, err = env.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: "FROM " + base + "\nRUN true\n"}, client.BuildOptions{})
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a second build of %s at once: %v, want a conflict", name, err)
	}
	cancel()
	<-done
	if ts, _ := env.c.Templates(ctx); hasTemplate(ts, name) {
		t.Error("a cancelled build registered its template")
	}
	// The cancelled build's sandbox goes with it.
	deadline := time.Now().Add(time.Minute)
	for {
		ss := buildSessions(t, name)
		live := 0
		for _, s := range ss {
			if s.State != "terminated" {
				live++
			}
		}
		if live == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cancelled build's sandbox is still live: %+v", ss)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// countEvents counts the events of kind.
func countEvents(events []client.BuildEvent, kind string) int {
	n := 0
	for _, e := range events {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

// hasTag reports whether session id runs a command tagged tag.
func hasTag(t *testing.T, id, tag string) bool {
	t.Helper()
	ps, err := env.c.Processes(ctxFor(t, time.Minute), id)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if p.Tag == tag {
			return true
		}
	}
	return false
}

// TestTemplateBuildEgress proves a build's RUN steps have no network by
// default and reach what the build's allow-list names: a RUN fetching
// from a test host fails without --allow (the fence refuses it) and, with
// the host allowed, writes what it fetched into the template.
func TestTemplateBuildEgress(t *testing.T) {
	need(t)
	host := testnet.NewHost(t, egressHost)
	host.ServeHTTP(t, 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "fetched-in-build") }))
	ctx := ctxFor(t, 5*time.Minute)
	df := "FROM base\nRUN curl -fsS --max-time 20 http://allowed.test/ > /root/fetched\n"

	name := tplName("build-net")
	deleteBuildSnapshotsAtEnd(t, env.c, name)
	_, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: df}, client.BuildOptions{})
	if errProblem(err) != "build-step-failed" {
		t.Fatalf("a RUN fetching without --allow: %v, want build-step-failed", err)
	}
	res, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: df, Allow: []string{"allowed.test:80"}}, client.BuildOptions{})
	if err != nil {
		t.Fatalf("with the host allowed: %v", err)
	}
	deleteTemplateAtEnd(t, env.c, name)
	if ss := buildSessions(t, name); len(ss) != 2 || ss[0].Network == nil || len(ss[0].Network.Allow) != 1 {
		t.Errorf("the builds' sandboxes: %+v", ss)
	}
	s := newSession(t, client.CreateRequest{Template: res.Template.Name})
	_, out, _ := run(t, s.ID, client.ExecRequest{Cmd: "cat /root/fetched", User: "root"})
	if out != "fetched-in-build" {
		t.Errorf("what the RUN fetched: %q", out)
	}
}

// TestTemplateBuildTenant proves a tenant's builds keep to its template
// limits: a context past max_template_mb is a 413 naming it, a build
// past max_templates a 429, and a build within them works.
func TestTemplateBuildTenant(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 5*time.Minute)
	_, _, tc := newTenant(t, env.c, "build", client.TenantPolicy{MaxTemplates: 1, MaxTemplateMB: 1})
	big := t.TempDir()
	if err := os.WriteFile(filepath.Join(big, "big"), []byte(randomText(2<<20)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := tc.BuildTemplate(ctx, tplName("t-big"), client.BuildRequest{Dockerfile: "FROM base\nCOPY big /root/big\n"}, client.BuildOptions{ContextDir: big})
	if problemStatus(err) != http.StatusRequestEntityTooLarge || errProblem(err) != "template-too-large" || !strings.Contains(err.Error(), "max_template_mb") {
		t.Fatalf("a context past max_template_mb: %v, want 413 template-too-large naming the limit", err)
	}
	name := tplName("t-ok")
	deleteBuildSnapshotsAtEnd(t, tc, name)
	if _, err := tc.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: "FROM base\nRUN echo ok > /root/ok\n"}, client.BuildOptions{}); err != nil {
		t.Fatalf("a tenant's build: %v", err)
	}
	deleteTemplateAtEnd(t, tc, name)
	_, err = tc.BuildTemplate(ctx, tplName("t-two"), client.BuildRequest{Dockerfile: "FROM base\nRUN true\n"}, client.BuildOptions{})
	if problemStatus(err) != http.StatusTooManyRequests {
		t.Fatalf("a build past max_templates: %v, want 429", err)
	}
	wantNoPartials(t)
}

// deleteBuildSnapshotsAtEnd deletes, when the test ends, the snapshots
// the builds of template name kept in the build cache (build-NAME-N),
// with what was made from them: a template a cached step was built on
// cannot be deleted while such a snapshot exists. Register it after the
// cleanup that deletes the builds' FROM template, so it runs first.
func deleteBuildSnapshotsAtEnd(t *testing.T, c *client.Client, name string) {
	t.Cleanup(func() {
		ctx := ctxFor(t, time.Minute)
		snaps, err := c.Snapshots(ctx)
		if err != nil {
			t.Errorf("list snapshots: %v", err)
			return
		}
		for _, sn := range snaps {
			if strings.HasPrefix(sn.Name, "build-"+name+"-") {
				if err := c.DeleteSnapshot(ctx, sn.ID, true); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
					t.Errorf("delete build snapshot %s: %v", sn.ID, err)
				}
			}
		}
	})
}

// TestTemplateBuildCopyModes proves a COPY keeps what the context's tar
// says (an executable's mode, a symlink as a link, a directory's
// contents) and that --chown owns them, and that a WORKDIR after USER is
// made (by root, as Docker's builder makes it) where the user could not.
func TestTemplateBuildCopyModes(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 5*time.Minute)
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "tools", "lib"), 0o755)
	os.WriteFile(filepath.Join(dir, "tools", "run.sh"), []byte("#!/bin/sh\necho tool-ran\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "tools", "lib", "data"), []byte("data\n"), 0o600)
	os.Symlink("run.sh", filepath.Join(dir, "tools", "link"))
	df := "FROM base\nCOPY --chown=user tools /opt/tools/\nUSER user\nWORKDIR /opt/work\nRUN /opt/tools/link > /home/user/out\n"
	name := tplName("build-modes")
	deleteBuildSnapshotsAtEnd(t, env.c, name)
	if _, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: df}, client.BuildOptions{ContextDir: dir}); err != nil {
		t.Fatalf("build: %v", err)
	}
	deleteTemplateAtEnd(t, env.c, name)
	s := newSession(t, client.CreateRequest{Template: name})
	out := sh(t, s.ID, "pwd && cd /opt/tools && stat -c '%n %U %a' run.sh lib lib/data && readlink link && cat /home/user/out")
	want := "/opt/work\nrun.sh user 755\nlib user 755\nlib/data user 600\nrun.sh\ntool-ran\n"
	if out != want {
		t.Fatalf("the copied tree:\n%s\nwant:\n%s", out, want)
	}
}
