package e2e

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// wantStatus fails t unless err is a client.Error with status (and, when
// field is not "", naming field).
func wantStatus(t *testing.T, what string, err error, status int, field string) {
	t.Helper()
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != status || (field != "" && ce.Field != field) {
		t.Fatalf("%s: %v, want %d naming %q", what, err, status, field)
	}
}

// TestVolumes: a volume written in one session is read in the next, is
// mounted read-write by one session at a time and read-only by others
// (where writes fail), holds its quota, refuses system paths and unknown
// names, cannot be removed while mounted, and is gone once removed. A
// gVisor session mounts it too.
func TestVolumes(t *testing.T) {
	need(t)
	if s := os.Getenv("FORKBOX_STORAGE"); s != "" && s != "btrfs" {
		t.Skip("volumes need the btrfs storage driver; this run uses " + s)
	}
	ctx := ctxFor(t, 5*time.Minute)
	v, err := env.c.CreateVolume(ctx, "work", 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.c.DeleteVolume(ctxFor(t, time.Minute), "work") })
	if v.SizeMB != 8 || v.Name != "work" {
		t.Fatalf("volume %+v", v)
	}
	_, err = env.c.CreateVolume(ctx, "work", 8)
	wantStatus(t, "second create", err, 409, "")
	_, err = env.c.CreateVolume(ctx, "Bad/Name", 8)
	wantStatus(t, "bad name", err, 400, "name")
	_, err = env.c.CreateVolume(ctx, "big", 0)
	wantStatus(t, "size 0", err, 400, "size_mb")

	rw := []client.VolumeMount{{Name: "work", Path: "/home/user/data"}}
	a := newSession(t, client.CreateRequest{Volumes: rw})
	if len(a.Volumes) != 1 || a.Volumes[0].Path != "/home/user/data" {
		t.Fatalf("session volumes: %+v", a.Volumes)
	}
	sh(t, a.ID, "echo kept > /home/user/data/note && mkdir -p /home/user/data/sub && id -u > /home/user/data/sub/owner")

	// A second read-write mount is refused; read-only is fine and cannot write.
	_, _, err = env.c.CreateSession(ctx, client.CreateRequest{Volumes: rw}, "")
	wantStatus(t, "second read-write mount", err, 409, "")
	ro := newSession(t, client.CreateRequest{Volumes: []client.VolumeMount{{Name: "work", Path: "/mnt/work", ReadOnly: true}}})
	if out := strings.TrimSpace(sh(t, ro.ID, "cat /mnt/work/note")); out != "kept" {
		t.Errorf("read-only mount reads %q", out)
	}
	if res, _, _ := run(t, ro.ID, client.ExecRequest{Cmd: "echo x > /mnt/work/other"}); res.ExitCode == 0 {
		t.Error("a write through the read-only mount succeeded")
	}
	got, err := env.c.GetVolume(ctx, "work")
	if err != nil || got.WriterSession != a.ID || len(got.ReaderSessions) != 1 || got.ReaderSessions[0] != ro.ID {
		t.Fatalf("volume mounts: %+v %v", got, err)
	}

	// The quota holds: 8 MiB, and the sandbox stays usable.
	res, _, errOut := run(t, a.ID, client.ExecRequest{Cmd: "dd if=/dev/zero of=/home/user/data/fill bs=1M count=32 conv=fsync"})
	if res.ExitCode == 0 || !strings.Contains(strings.ToLower(errOut), "quota") && !strings.Contains(strings.ToLower(errOut), "space") {
		t.Errorf("writing 32 MiB into an 8 MiB volume: exit %d, %q", res.ExitCode, errOut)
	}
	sh(t, a.ID, "rm -f /home/user/data/fill")

	// Bad mounts.
	for _, m := range []struct {
		m     client.VolumeMount
		field string
	}{
		{client.VolumeMount{Name: "work", Path: "/etc"}, "volumes[0].path"},
		{client.VolumeMount{Name: "work", Path: "/usr/local"}, "volumes[0].path"},
		{client.VolumeMount{Name: "work", Path: "/home/user/../../proc"}, "volumes[0].path"},
		{client.VolumeMount{Name: "nosuch", Path: "/mnt/x"}, "volumes[0].name"},
	} {
		_, _, err := env.c.CreateSession(ctx, client.CreateRequest{Volumes: []client.VolumeMount{m.m}}, "")
		wantStatus(t, "mount "+m.m.Path, err, 400, m.field)
	}

	// Not removable while mounted; the next session reads what the first wrote.
	wantStatus(t, "remove while mounted", env.c.DeleteVolume(ctx, "work"), 409, "")
	if err := env.c.DeleteSession(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if err := env.c.DeleteSession(ctx, ro.ID); err != nil {
		t.Fatal(err)
	}
	b := newSession(t, client.CreateRequest{Volumes: rw})
	if out := sh(t, b.ID, "cat /home/user/data/note; stat -c %u /home/user/data/sub/owner"); out != "kept\n1000\n" {
		t.Errorf("next session reads %q", out)
	}
	if err := env.c.DeleteSession(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("runsc"); err == nil {
		g := newSession(t, client.CreateRequest{Isolation: "gvisor", Volumes: rw})
		if out := strings.TrimSpace(sh(t, g.ID, "cat /home/user/data/note && echo g > /home/user/data/g && cat /home/user/data/g")); out != "kept\ng" {
			t.Errorf("gVisor session on the volume: %q", out)
		}
		if err := env.c.DeleteSession(ctx, g.ID); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.c.DeleteVolume(ctx, "work"); err != nil {
		t.Fatal(err)
	}
	_, err = env.c.GetVolume(ctx, "work")
	wantStatus(t, "get after remove", err, 404, "")
}

// TestVolumesSurviveRestart: a restarted daemon keeps a volume's files
// (its sweep of layers no session owns leaves volumes alone) and the
// adopted session's read-write mount (a second one is still refused).
func TestVolumesSurviveRestart(t *testing.T) {
	need(t)
	if s := os.Getenv("FORKBOX_STORAGE"); s != "" && s != "btrfs" {
		t.Skip("volumes need the btrfs storage driver; this run uses " + s)
	}
	o := newOwnDaemon(t)
	ctx := ctxFor(t, 3*time.Minute)
	if _, err := o.c.CreateVolume(ctx, "keep", 16); err != nil {
		t.Fatal(err)
	}
	rw := []client.VolumeMount{{Name: "keep", Path: "/home/user/keep"}}
	s, _, err := o.c.CreateSession(ctx, client.CreateRequest{Volumes: rw}, "")
	if err != nil {
		t.Fatal(err)
	}
	if out, err := o.c.ExecCollect(ctx, s.ID, client.ExecRequest{Cmd: "echo before > /home/user/keep/f"}); err != nil || out.ExitCode != 0 {
		t.Fatalf("write: %+v %v", out, err)
	}
	o.restart(t, nil)
	_, _, err = o.c.CreateSession(ctx, client.CreateRequest{Volumes: rw}, "")
	wantStatus(t, "second read-write mount after the restart", err, 409, "")
	if err := o.c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	o.restart(t, nil) // with no session mounting it
	s2, _, err := o.c.CreateSession(ctx, client.CreateRequest{Volumes: rw}, "")
	if err != nil {
		t.Fatal(err)
	}
	out, err := o.c.ExecCollect(ctx, s2.ID, client.ExecRequest{Cmd: "cat /home/user/keep/f"})
	if err != nil || string(out.Stdout) != "before\n" {
		t.Fatalf("after two restarts: %+v %v", out, err)
	}
	if err := o.c.DeleteSession(ctx, s2.ID); err != nil {
		t.Fatal(err)
	}
	if err := o.c.DeleteVolume(ctx, "keep"); err != nil {
		t.Fatal(err)
	}
}

// TestVolumeTargetSymlink: a session plants symlinks where a later
// session mounts a volume (/home/user/data to /etc, /home/user/up to /);
// a session started from its snapshot with a volume there is refused with
// a field error naming the mount's path, instead of the runtime following
// the link inside the sandbox and mounting the volume over /etc.
func TestVolumeTargetSymlink(t *testing.T) {
	need(t)
	if s := os.Getenv("FORKBOX_STORAGE"); s != "" && s != "btrfs" {
		t.Skip("volumes need the btrfs storage driver; this run uses " + s)
	}
	ctx := ctxFor(t, 3*time.Minute)
	if _, err := env.c.CreateVolume(ctx, "planted", 4); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.c.DeleteVolume(ctxFor(t, time.Minute), "planted") })
	a := newSession(t, client.CreateRequest{})
	sh(t, a.ID, "ln -s /etc /home/user/data && ln -s / /home/user/up && mkdir -p /home/user/real")
	sn, err := env.c.Snapshot(ctx, a.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.c.DeleteSnapshot(ctxFor(t, time.Minute), sn.ID, false) })
	for _, p := range []string{"/home/user/data", "/home/user/data/x", "/home/user/up/etc"} {
		s, _, err := env.c.CreateSession(ctx, client.CreateRequest{Snapshot: sn.ID,
			Volumes: []client.VolumeMount{{Name: "planted", Path: p}}}, "")
		if err == nil {
			out, _ := env.c.ExecCollect(ctx, s.ID, client.ExecRequest{Cmd: "ls /etc | head -3"})
			_ = env.c.DeleteSession(ctx, s.ID)
			t.Fatalf("volume at %s through a symlink was mounted (/etc lists %q)", p, out.Stdout)
		}
		wantStatus(t, "volume at "+p, err, 400, "volumes[0].path")
	}
	// A real directory of the snapshot is still a fine target.
	s := newSession(t, client.CreateRequest{Snapshot: sn.ID,
		Volumes: []client.VolumeMount{{Name: "planted", Path: "/home/user/real"}}})
	sh(t, s.ID, "touch /home/user/real/ok")
	if err := env.c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}

// TestVolumeNoReflinks: a sandbox cannot share data between its layer and
// a volume by reflink (FICLONE, FICLONERANGE, FIDEDUPERANGE and
// copy_file_range are refused), which would count against neither's disk
// limit; copies fall back to writing the bytes, which count.
func TestVolumeNoReflinks(t *testing.T) {
	need(t)
	if s := os.Getenv("FORKBOX_STORAGE"); s != "" && s != "btrfs" {
		t.Skip("volumes need the btrfs storage driver; this run uses " + s)
	}
	ctx := ctxFor(t, 3*time.Minute)
	if _, err := env.c.CreateVolume(ctx, "noreflink", 16); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.c.DeleteVolume(ctxFor(t, time.Minute), "noreflink") })
	s := newSession(t, client.CreateRequest{DiskMB: 64, Volumes: []client.VolumeMount{{Name: "noreflink", Path: "/home/user/data"}}})
	script := `import ctypes, fcntl, os, subprocess
open("/home/user/src", "wb").write(os.urandom(12 << 20))
src = os.open("/home/user/src", os.O_RDONLY)
dst = os.open("/home/user/data/dst", os.O_WRONLY | os.O_CREAT, 0o644)
for name, req in (("FICLONE", 0x40049409), ("FICLONE_HIGH", 0xffffffff40049409)):
    try:
        fcntl.ioctl(dst, req, src)
        print(name, "CLONED")
    except OSError as e:
        print(name, "refused", e.errno)
try:
    os.copy_file_range(src, dst, 1 << 20)
    print("copy_file_range COPIED")
except OSError as e:
    print("copy_file_range refused", e.errno)
r = subprocess.run(["cp", "--reflink=always", "/home/user/src", "/home/user/data/b"], capture_output=True)
print("cp_always", r.returncode)
r = subprocess.run(["cp", "/home/user/src", "/home/user/data/c"], capture_output=True)
print("cp_plain", r.returncode, os.path.getsize("/home/user/data/c"))
`
	_, out, errOut := run(t, s.ID, client.ExecRequest{Argv: []string{"python3", "-c", script}, TimeoutS: 100})
	for _, want := range []string{"FICLONE refused", "FICLONE_HIGH refused", "copy_file_range refused 38", "cp_plain 0 12582912"} {
		if !strings.Contains(out, want) {
			t.Errorf("want %q in:\n%s\n%s", want, out, errOut)
		}
	}
	if strings.Contains(out, "CLONED") || strings.Contains(out, "COPIED") || strings.Contains(out, "cp_always 0") {
		t.Errorf("a reflink got through:\n%s", out)
	}
	v, err := env.c.GetVolume(ctx, "noreflink")
	if err != nil || v.UsedBytes > 17<<20 {
		t.Errorf("volume use %d bytes for a 16 MiB volume (%v)", v.UsedBytes, err)
	}
}
