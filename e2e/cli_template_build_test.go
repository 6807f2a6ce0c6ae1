package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/forkbox/forkbox/client"
)

// TestCLITemplateBuild proves forkbox template build from the command
// line: the --from-image shorthand FROM an image in a real registry
// (pulled once into a from-HASH template; its RUN writes /usr/local and
// --start becomes the start command), a Dockerfile with a context
// directory printing plain step lines, the same build again printing
// every step cached, and a failing RUN exiting non-zero with its exit
// code on standard error.
func TestCLITemplateBuild(t *testing.T) {
	need(t)
	reg := newTestRegistry(t)
	img := withLayers(t, busyboxV1(t), fileLayer(t, "etc/cli-build", uniq(t)))
	ref, _ := reg.push(t, "test/build:1", img)
	sum := sha256.Sum256([]byte("default\n" + ref))
	deleteTemplateAtEnd(t, env.c, "from-"+hex.EncodeToString(sum[:8]))
	short := tplName("cli-short")
	deleteBuildSnapshotsAtEnd(t, env.c, short)

	out, errOut, code := forkbox(t, "", "template", "build", short, "--from-image", ref,
		"--run", "busybox mkdir -p /usr/local/share && echo from-cli > /usr/local/share/cli", "--start", "busybox sleep 1; busybox touch /tmp/up; exec busybox sleep 100000", "--ready", "busybox test -e /tmp/up")
	if code != 0 || out != short+"\n" || !strings.Contains(errOut, "[1/2] RUN") || !strings.Contains(errOut, "[1/2] done in") {
		t.Fatalf("template build --from-image: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	deleteTemplateAtEnd(t, env.c, short)
	df := tplName("cli-df")
	bad := tplName("cli-bad")
	deleteBuildSnapshotsAtEnd(t, env.c, df)
	deleteBuildSnapshotsAtEnd(t, env.c, bad)
	s := newSession(t, client.CreateRequest{Template: short})
	if got := sh(t, s.ID, "cat /usr/local/share/cli /etc/cli-build >/dev/null && cat /usr/local/share/cli"); got != "from-cli\n" {
		t.Errorf("in the shorthand's template: %q", got)
	}
	if !hasTag(t, s.ID, "start") {
		t.Error("--start is not running in the session")
	}
	// The create waited for --ready: what the start command makes after
	// a second is there at once.
	if got := sh(t, s.ID, "busybox test -e /tmp/up && echo up"); got != "up\n" {
		t.Errorf("right after the create: %q, want the ready check's file", got)
	}
	out, _, code = forkbox(t, "", "template", "inspect", short)
	if code != 0 || !strings.Contains(out, "ready:         /bin/sh -c busybox test -e /tmp/up (a create waits until it exits 0, at most 30 s)") ||
		!strings.Contains(out, "start:         /bin/sh -c busybox sleep 1;") {
		t.Errorf("template inspect: exit %d\n%s", code, out)
	}

	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM "+short+"\nCOPY note.txt /etc/note.txt\nENV NOTE=1\nRUN cat /etc/note.txt\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "note.txt"), []byte("a note\n"), 0o644)
	out, errOut, code = forkbox(t, "", "template", "build", df, "-f", filepath.Join(dir, "Dockerfile"), "--context", dir)
	if code != 0 || out != df+"\n" || !strings.Contains(errOut, "[1/3] COPY note.txt /etc/note.txt\n") || !strings.Contains(errOut, "a note\n") ||
		!strings.Contains(errOut, "built "+df+": 3 steps, 1 sandboxes") {
		t.Fatalf("template build -f: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	deleteTemplateAtEnd(t, env.c, df)
	out, _, _ = forkbox(t, "", "template", "ls")
	if !strings.Contains(out, "LAYERS") || !regexp.MustCompile(`(?m)^`+regexp.QuoteMeta(df)+` +build +- +\d+ +3 +runc +yes +yes +sha256:`).MatchString(out) {
		t.Errorf("template ls: want %s with source build, 3 steps, tier runc, and the start command and ready check it inherited:\n%s", df, out)
	}
	again := tplName("cli-again")
	_, errOut, code = forkbox(t, "", "template", "build", again, "-f", filepath.Join(dir, "Dockerfile"), "--context", dir)
	if code != 0 || strings.Count(errOut, " cached\n") != 3 || !strings.Contains(errOut, "0 sandboxes") {
		t.Fatalf("the same build again: exit %d, stderr %q (want 3 cached steps, no sandbox)", code, errOut)
	}
	deleteTemplateAtEnd(t, env.c, again)

	// On a terminal: the running step on a line redrawn in place, a line
	// per step as it ends.
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	ttyName := tplName("cli-tty")
	deleteBuildSnapshotsAtEnd(t, env.c, ttyName)
	cmd := exec.Command(env.cli, "template", "build", ttyName, "--from-image", short, "--run", "echo on-a-tty")
	cmd.Env = append(os.Environ(), "FORKBOX_URL="+env.d.URL, "FORKBOX_API_KEY="+env.key)
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, tty
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	tty.Close()
	var screen bytes.Buffer
	done := make(chan struct{})
	go func() { io.Copy(&screen, ptmx); close(done) }()
	err = cmd.Wait()
	<-done
	deleteTemplateAtEnd(t, env.c, ttyName)
	if err != nil || !strings.Contains(screen.String(), "\r\x1b[K") || !strings.Contains(screen.String(), "on-a-tty") ||
		!strings.Contains(screen.String(), "[1/1] RUN [\"/bin/sh\",\"-c\",\"echo on-a-tty\"]: done in ") {
		t.Fatalf("template build on a terminal: %v; terminal got %q, stdout %q", err, screen.String(), stdout.String())
	}

	_, errOut, code = forkbox(t, "", "template", "build", bad, "--from-image", short, "--run", "echo no-good; exit 3")
	if code == 0 || !strings.Contains(errOut, "[1/1] failed: exit code 3") || !strings.Contains(errOut, "no-good") {
		t.Fatalf("a failing build: exit %d, stderr %q", code, errOut)
	}
	if ts, _ := env.c.Templates(ctxFor(t, time.Minute)); hasTemplate(ts, bad) {
		t.Error("a failed build registered its template")
	}
}

// TestTemplateBuildGVisor proves a build's RUN steps run in the tier the
// build names: a gVisor build's sandbox is a gVisor session, and the
// template it makes has what its RUN wrote.
func TestTemplateBuildGVisor(t *testing.T) {
	needGVisor(t)
	img := busyboxImage(t)
	ctx := ctxFor(t, 5*time.Minute)
	base := tplName("bb-gv")
	if _, err := env.c.ImportTemplate(ctx, base, "", bytes.NewReader(img), int64(len(img))); err != nil {
		t.Fatal(err)
	}
	deleteTemplateAtEnd(t, env.c, base)
	name := tplName("built-gv")
	deleteBuildSnapshotsAtEnd(t, env.c, name)
	res, err := env.c.BuildTemplate(ctx, name, client.BuildRequest{Isolation: "gvisor",
		Dockerfile: "FROM " + base + "\nRUN busybox mkdir -p /usr/local/share && busybox uname -a > /usr/local/share/kernel\n"}, client.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deleteTemplateAtEnd(t, env.c, name)
	if res.Sandboxes != 1 || res.Template.Tier != "gvisor" {
		t.Fatalf("build %+v, want one sandbox and tier gvisor", res)
	}
	if ss := buildSessions(t, name); len(ss) != 1 || ss[0].Driver != "gvisor" {
		t.Fatalf("the build's sandboxes: %+v, want one gVisor session", ss)
	}
	s := newSession(t, client.CreateRequest{Template: name})
	if out := sh(t, s.ID, "cat /usr/local/share/kernel"); !strings.Contains(out, "Linux") {
		t.Errorf("what the gVisor RUN wrote: %q", out)
	}
}
