package e2e

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// configuredImage builds a one-layer image with a static busybox, a user
// "app" (uid 1500, home /home/app) in its /etc/passwd owning /tmp/work
// (under /tmp: a sandbox writes only its home directories and /tmp), and
// a config of USER app, WORKDIR /tmp/work, ENV GREETING=hello-env and
// an ENTRYPOINT + CMD that writes who, where and $GREETING to
// /tmp/started and then sleeps (or cmd, when given); it returns it as a
// `docker save` tarball.
func configuredImage(t *testing.T, cmd ...string) []byte {
	t.Helper()
	bb, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("needs a static /bin/busybox (Debian busybox-static; make deps installs it)")
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, d := range []string{"bin/", "etc/", "home/", "tmp/"} {
		tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755})
	}
	for _, d := range []string{"tmp/work/", "home/app/"} {
		tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, Uid: 1500, Gid: 1500})
	}
	tw.WriteHeader(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb))})
	tw.Write(bb)
	for _, applet := range []string{"sh", "echo", "id", "cat", "pwd", "ls", "sleep", "env", "whoami", "true"} {
		tw.WriteHeader(&tar.Header{Name: "bin/" + applet, Typeflag: tar.TypeSymlink, Linkname: "busybox"})
	}
	for f, data := range map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\napp:x:1500:1500:app:/home/app:/bin/sh\n",
		"etc/group":  "root:x:0:\napp:x:1500:\n",
	} {
		tw.WriteHeader(&tar.Header{Name: f, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))})
		tw.Write([]byte(data))
	}
	tw.Close()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		t.Fatal(err)
	}
	cfg := v1.Config{
		Env: []string{"PATH=/bin", "GREETING=hello-env"}, WorkingDir: "/tmp/work", User: "app",
		Entrypoint: []string{"/bin/sh", "-c"},
		Cmd:        []string{`{ whoami; pwd; echo "$GREETING"; } > /tmp/started; exec sleep 3600`},
	}
	if len(cmd) > 0 {
		cfg.Entrypoint, cfg.Cmd = nil, cmd
	}
	img, err = mutate.Config(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	tag, _ := name.NewTag("forkbox.test/configured:1")
	var out bytes.Buffer
	if err := tarball.Write(tag, img, &out); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// TestCLITemplateConfig proves `forkbox template import --start-cmd`
// keeps the image's USER, WORKDIR, ENV and CMD: its sessions run as app in
// /tmp/work with GREETING set, cp's relative paths land in /tmp/work, and
// the start command ran in the background as app; template ls shows the
// uploaded file's name as the source (never a daemon path) and the user.
// On a terminal the import shows its progress on one line; elsewhere it
// prints none.
func TestCLITemplateConfig(t *testing.T) {
	need(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "configured.tar")
	if err := os.WriteFile(file, configuredImage(t), 0o644); err != nil {
		t.Fatal(err)
	}
	tpl := "cfg-" + strings.ReplaceAll(time.Now().Format("150405.000"), ".", "")
	out, errOut, code := forkbox(t, "", "template", "import", "--start-cmd", tpl, file)
	if code != 0 || errOut != "" || !strings.Contains(out, "user:    app") || !strings.Contains(out, "workdir: /tmp/work") ||
		!strings.Contains(out, "start:   /bin/sh -c") {
		t.Fatalf("template import: exit %d, stdout %q, stderr %q (a non-terminal gets no progress)", code, out, errOut)
	}
	defer forkbox(t, "", "template", "rm", tpl)
	out, _, _ = forkbox(t, "", "template", "ls")
	var row string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, tpl+" ") {
			row = l
		}
	}
	if f := strings.Fields(row); len(f) < 3 || f[1] != "configured.tar" || f[2] != "app" {
		t.Fatalf("template ls row %q, want source configured.tar and user app:\n%s", row, out)
	}

	out, errOut, code = forkbox(t, "", "create", "--template", tpl)
	if code != 0 {
		t.Fatalf("create from %s: %d %s", tpl, code, errOut)
	}
	id := strings.TrimSpace(out)
	defer forkbox(t, "", "rm", id)
	out, errOut, code = forkbox(t, "", "exec", id, "--", "sh", "-c", `whoami; pwd; echo "$GREETING"`)
	if code != 0 || out != "app\n/tmp/work\nhello-env\n" {
		t.Fatalf("exec in a session of %s: %d %q %q; want app, /tmp/work, hello-env", tpl, code, out, errOut)
	}
	// The start command runs in the background: wait (bounded) for its file.
	started := ""
	for i := 0; i < 100 && started == ""; i++ {
		started, _, _ = forkbox(t, "", "exec", id, "--", "sh", "-c", "cat /tmp/started 2>/dev/null || true")
		if started == "" {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if started != "app\n/tmp/work\nhello-env\n" {
		t.Fatalf("the start command wrote %q; want app, /tmp/work, hello-env", started)
	}
	local := filepath.Join(dir, "in.txt")
	os.WriteFile(local, []byte("into the workdir\n"), 0o644)
	if _, errOut, code := forkbox(t, "", "cp", local, id+":in.txt"); code != 0 {
		t.Fatalf("cp into %s:in.txt: %s", id, errOut)
	}
	out, _, _ = forkbox(t, "", "exec", id, "--", "sh", "-c", "cat /tmp/work/in.txt; ls -n /tmp/work/in.txt")
	if !strings.HasPrefix(out, "into the workdir\n") || !strings.Contains(out, " 1500 ") {
		t.Fatalf("cp ID:in.txt did not write /tmp/work/in.txt as app: %q", out)
	}
	back := t.TempDir()
	if _, errOut, code := forkbox(t, "", "cp", id+":in.txt", back); code != 0 {
		t.Fatalf("cp %s:in.txt out: %s", id, errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(back, "in.txt")); string(b) != "into the workdir\n" {
		t.Fatalf("copied out %q", b)
	}

	// A session of a snapshot of the template runs as its USER too.
	snap, errOut, code := forkbox(t, "", "snapshot", id)
	if code != 0 {
		t.Fatalf("snapshot: %s", errOut)
	}
	snap = strings.TrimSpace(snap)
	defer forkbox(t, "", "snapshot", "rm", "--force", snap)
	out, errOut, code = forkbox(t, "", "create", "--snapshot", snap)
	if code != 0 {
		t.Fatalf("create --snapshot: %s", errOut)
	}
	child := strings.TrimSpace(out)
	defer forkbox(t, "", "rm", child)
	if out, _, _ := forkbox(t, "", "exec", child, "--", "whoami"); out != "app\n" {
		t.Fatalf("a session of a snapshot of %s runs as %q, want app", tpl, out)
	}

	// A start command that cannot start fails the create, leaving no session.
	bad := filepath.Join(dir, "bad.tar")
	os.WriteFile(bad, configuredImage(t, "/bin/no-such-server"), 0o644)
	if _, errOut, code := forkbox(t, "", "template", "import", "--start-cmd", tpl+"-bad", bad); code != 0 {
		t.Fatalf("import of bad.tar: %s", errOut)
	}
	defer forkbox(t, "", "template", "rm", tpl+"-bad")
	before := liveIDs(t)
	_, errOut, code = forkbox(t, "", "create", "--template", tpl+"-bad")
	if code != 125 || !strings.Contains(errOut, "start command") || !strings.Contains(errOut, "/bin/no-such-server") {
		t.Fatalf("create with a start command that cannot start: exit %d, stderr %q", code, errOut)
	}
	if after := liveIDs(t); len(after) != len(before) {
		t.Fatalf("the failed create left a session: %v, before %v", after, before)
	}

	// On a terminal: one line redrawn with \r, erased at the end.
	ptmx, tty, err := pty.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	cmd := exec.Command(env.cli, "template", "import", tpl+"-tty", file)
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
	<-done // (the copy ends when the terminal's last writer is gone)
	defer forkbox(t, "", "template", "rm", tpl+"-tty")
	if err != nil || !strings.Contains(screen.String(), "\rconfigured.tar: ") || !strings.Contains(screen.String(), "unpacking") {
		t.Fatalf("template import on a terminal: %v; terminal got %q, stdout %q", err, screen.String(), stdout.String())
	}
}
