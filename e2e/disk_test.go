package e2e

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// TestDiskLimit proves writing past a session's disk limit fails inside
// the sandbox with ENOSPC or EDQUOT, the sandbox stays usable, and space
// freed can be used again.
func TestDiskLimit(t *testing.T) {
	s := newSession(t, client.CreateRequest{DiskMB: 64})
	res, _, errOut := run(t, s.ID, client.ExecRequest{Cmd: "dd if=/dev/zero of=big bs=1M count=256 conv=fsync"})
	if res.ExitCode == 0 || !(strings.Contains(errOut, "No space left") || strings.Contains(errOut, "quota exceeded")) {
		t.Fatalf("writing 256 MiB under a 64 MiB limit: %+v %q", res, errOut)
	}
	if got := sh(t, s.ID, "echo ok"); got != "ok\n" {
		t.Fatalf("sandbox after hitting the limit: %q", got)
	}
	sh(t, s.ID, "rm big && sync && dd if=/dev/zero of=small bs=1M count=16 conv=fsync 2>/dev/null && echo written")
	if _, err := env.c.Upload(ctxFor(t, time.Minute), s.ID, "/home/user/up.bin", strings.NewReader(strings.Repeat("x", 100<<20)), 100<<20, ""); !errors.Is(err, errdefs.ErrInsufficientStorage) {
		t.Fatalf("uploading 100 MiB past the limit: %v, want 507 insufficient storage", err)
	}
}

// TestSnapshotTamperRefused proves a snapshot whose stored files change
// behind forkbox's back fails its integrity check: restoring or forking it
// is refused with a clear error and nothing starts.
func TestSnapshotTamperRefused(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	sh(t, s.ID, "echo original > data.txt")
	sn, err := env.c.Snapshot(ctxFor(t, time.Minute), s.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	tamperSnapshot(t, sn, "home/user/data.txt")
	before, _ := env.c.ListSessions(ctxFor(t, time.Minute), client.ListOptions{})
	_, _, err = env.c.CreateSession(ctxFor(t, time.Minute), client.CreateRequest{Snapshot: sn.ID}, "")
	if !errors.Is(err, errdefs.ErrConflict) || !strings.Contains(err.Error(), "integrity") {
		t.Fatalf("restore of a tampered snapshot: %v, want an integrity error", err)
	}
	if _, err := env.c.ForkSnapshot(ctxFor(t, time.Minute), sn.ID, client.ForkRequest{Count: 2}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("fork of a tampered snapshot: %v", err)
	}
	after, _ := env.c.ListSessions(ctxFor(t, time.Minute), client.ListOptions{})
	if len(after) != len(before) {
		t.Fatalf("a refused restore left sessions: %d before, %d after", len(before), len(after))
	}
	_ = env.c.DeleteSnapshot(ctxFor(t, time.Minute), sn.ID, true)
}

// tamperSnapshot appends to file rel inside snapshot sn's stored data,
// however its storage driver keeps it.
func tamperSnapshot(t *testing.T, sn *client.Snapshot, rel string) {
	t.Helper()
	base := filepath.Join(env.dataDir, "storage", sn.Storage, "snapshots", sn.ID)
	switch sn.Storage {
	case "btrfs":
		runHost(t, "btrfs", "property", "set", "-ts", base, "ro", "false")
		defer runHost(t, "btrfs", "property", "set", "-ts", base, "ro", "true")
	case "overlay":
		base = filepath.Join(base, "layer")
	default:
		t.Skipf("no tamper recipe for storage %q", sn.Storage)
	}
	f, err := os.OpenFile(filepath.Join(base, rel), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatalf("tamper: %v", err)
	}
	f.WriteString("tampered\n")
	f.Close()
	_ = exec.Command("sync").Run()
}

// TestNoNestedSubvolumes proves code in a sandbox cannot create btrfs
// subvolumes or snapshots (which would escape the disk limit), not even by
// setting high bits in the ioctl request, while ordinary ioctls work.
func TestNoNestedSubvolumes(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	script := `import ctypes, fcntl, os, struct, termios
libc = ctypes.CDLL(None, use_errno=True)
libc.ioctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p]
fd = os.open("/tmp", os.O_RDONLY)
for req in (0x5000940e, 0x50009418, 0x50009401, 0x50009417, 0xffffffff5000940e):
    buf = ctypes.create_string_buffer(4096)
    name = b"sub%x" % (req & 0xffffffffffff)
    ctypes.memmove(ctypes.addressof(buf) + 8, name, len(name))
    ctypes.memmove(ctypes.addressof(buf) + 56, name, len(name))
    r = libc.ioctl(fd, req, buf)
    print("CREATED" if r == 0 else "refused", hex(req), ctypes.get_errno())
r, w = os.pipe()
os.write(w, b"abc")
print("FIONREAD", struct.unpack("i", fcntl.ioctl(r, termios.FIONREAD, b"\0\0\0\0"))[0])
`
	for _, user := range []string{"user", "root"} {
		_, out, errOut := run(t, s.ID, client.ExecRequest{Argv: []string{"python3", "-c", script}, User: user})
		if strings.Contains(out, "CREATED") || !strings.Contains(out, "FIONREAD 3") {
			t.Fatalf("as %s: %s %s", user, out, errOut)
		}
	}
}
