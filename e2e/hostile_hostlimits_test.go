package e2e

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"golang.org/x/sys/unix"
)

// Attacks by one tenant's sandbox on kernel limits the host shares: the
// per-user counts of the kernel (inotify instances, message queue bytes,
// pipe buffers) and the host's open-file table. In each, tenant A's
// sandbox takes all it can and holds it; tenant B's sandbox, and the host,
// must not notice.

// hostileHolder runs script (Python) in a background command of session
// id through c; the script prints one line when it holds what it took and
// then sleeps. It returns that line.
func hostileHolder(t *testing.T, c *client.Client, id, script string) string {
	t.Helper()
	ctx := ctxFor(t, 3*time.Minute)
	if _, err := c.Upload(ctx, id, "/tmp/holder.py", strings.NewReader(script), int64(len(script)), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ExecBackground(ctx, id, client.ExecRequest{
		Cmd: "python3 /tmp/holder.py > /tmp/holder.out 2>&1", TimeoutS: 300,
	}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		var out bytes.Buffer
		res, err := c.Exec(ctx, id, client.ExecRequest{Argv: []string{"cat", "/tmp/holder.out"}}, &out, nil)
		if err == nil && res.ExitCode == 0 && strings.HasSuffix(out.String(), "\n") {
			return strings.TrimSpace(out.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatal("the holder never said what it holds")
	return ""
}

// tenantSessions makes one session for each of two new tenants and
// returns their clients and ids.
func tenantSessions(t *testing.T) (ca *client.Client, a string, cb *client.Client, b string) {
	t.Helper()
	_, _, ca = newTenant(t, env.c, "limits-a", client.TenantPolicy{})
	_, _, cb = newTenant(t, env.c, "limits-b", client.TenantPolicy{})
	for _, p := range []struct {
		c  *client.Client
		id *string
	}{{ca, &a}, {cb, &b}} {
		s, _, err := p.c.CreateSession(ctxFor(t, time.Minute), client.CreateRequest{}, "")
		if err != nil {
			t.Fatal(err)
		}
		*p.id = s.ID
	}
	return ca, a, cb, b
}

// pyOut runs a Python program in session id through c and returns its
// stdout, failing the test unless it exits 0.
func pyOut(t *testing.T, c *client.Client, id, script string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	res, err := c.Exec(ctxFor(t, 2*time.Minute), id, client.ExecRequest{Argv: []string{"python3", "-c", script}}, &out, &errOut)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("python in %s: %v, exit %v: %s %s", id, err, res, out.String(), errOut.String())
	}
	return strings.TrimSpace(out.String())
}

const inotifyInit = `
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
print(fd >= 0, ctypes.get_errno())
`

// TestHostileInotifyAcrossTenants: inotify instances were counted for the
// owner of each sandbox's user namespace -- host root, for every sandbox
// -- against fs.inotify.max_user_instances (128). One tenant taking 128
// made inotify_init1 fail with EMFILE in every other tenant's sandbox
// (file watchers, dev servers, E2B watchDir) and for the host's root.
func TestHostileInotifyAcrossTenants(t *testing.T) {
	need(t)
	ca, a, cb, b := tenantSessions(t)
	held := hostileHolder(t, ca, a, `
import ctypes, time
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while len(fds) < 100000:
    fd = libc.inotify_init1(0)
    if fd < 0:
        break
    fds.append(fd)
print(len(fds), ctypes.get_errno(), flush=True)
time.sleep(300)
`)
	if n, _ := strconv.Atoi(strings.Fields(held)[0]); n == 0 || n >= 100000 {
		t.Fatalf("tenant A's sandbox held %q inotify instances: no limit, or none", held)
	}
	if got := pyOut(t, cb, b, inotifyInit); !strings.HasPrefix(got, "True") {
		t.Errorf("with tenant A holding its inotify instances (%s), tenant B's inotify_init1 failed: %s", held, got)
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		t.Errorf("with tenant A holding its inotify instances, the host's root cannot make one: %v", err)
	} else {
		unix.Close(fd)
	}
}

// TestHostileMessageQueuesAcrossTenants: POSIX message queue bytes
// (RLIMIT_MSGQUEUE, 800 KiB) were counted the same way: one sandbox's ten
// queues made mq_open fail in every other sandbox.
func TestHostileMessageQueuesAcrossTenants(t *testing.T) {
	need(t)
	const mq = `
import ctypes, os, sys, time
rt = ctypes.CDLL("librt.so.1", use_errno=True)
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long), ("cur", ctypes.c_long)]
rt.mq_open.restype = ctypes.c_int
rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(Attr)]
attr = Attr(0, 10, 8192, 0)
n = 0
while n < LIMIT:
    if rt.mq_open(b"/q%d" % n, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(attr)) < 0:
        break
    n += 1
print(n, ctypes.get_errno(), flush=True)
if HOLD:
    time.sleep(300)
`
	ca, a, cb, b := tenantSessions(t)
	held := hostileHolder(t, ca, a, strings.NewReplacer("LIMIT", "1000", "HOLD", "True").Replace(mq))
	if n, _ := strconv.Atoi(strings.Fields(held)[0]); n == 0 || n >= 1000 {
		t.Fatalf("tenant A's sandbox opened %q message queues: no limit, or none", held)
	}
	if got := pyOut(t, cb, b, strings.NewReplacer("LIMIT", "1", "HOLD", "False").Replace(mq)); !strings.HasPrefix(got, "1 ") {
		t.Errorf("with tenant A holding its message queues (%s), tenant B could not open one: %s", held, got)
	}
}

// TestHostilePipeBuffersAcrossTenants: pipe buffers are counted per host
// uid against fs.pipe-user-pages-soft (64 MiB); past it a user's pipes
// get one page and F_SETPIPE_SZ fails with EPERM. Every sandbox's user was
// the same host uid, so one tenant's 1100 pipes took larger pipes from
// all others.
func TestHostilePipeBuffersAcrossTenants(t *testing.T) {
	need(t)
	needIDMappedStorage(t)
	ca, a, cb, b := tenantSessions(t)
	held := hostileHolder(t, ca, a, `
import fcntl, os, time
pipes = [os.pipe() for _ in range(1100)]
r, w = os.pipe()
try:
    fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
    print("grew", flush=True)
except OSError as e:
    print("refused", e.errno, flush=True)
time.sleep(300)
`)
	if !strings.HasPrefix(held, "refused") {
		t.Fatalf("tenant A's sandbox with 1100 pipes could still grow one (%q): the soft limit is not where the test thinks", held)
	}
	got := pyOut(t, cb, b, `
import fcntl, os
r, w = os.pipe()
try:
    fcntl.fcntl(w, 1031, 1 << 20)
    print("grew")
except OSError as e:
    print("refused", e.errno)
`)
	if got != "grew" {
		t.Errorf("with tenant A over its pipe buffer budget, tenant B's F_SETPIPE_SZ was refused: %s", got)
	}
}

// TestHostileFileTableBounded: a sandbox's processes could open files
// until the host's open-file table (fs.file-max, 2.47 M here) was full:
// one 1.5 GiB session held 2.45 M and other sandboxes failed with ENFILE.
// Open files cost a sandbox kernel memory charged to its memory limit, and
// the daemon sizes the file table for the memory the host admits: a
// default-size session that opens all it can leaves the host's table with
// more than its reserve, and another tenant's sandbox opens files fine.
func TestHostileFileTableBounded(t *testing.T) {
	need(t)
	info, err := env.c.Info(ctxFor(t, time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	lim := info.Limits
	if lim.OpenFilesPerProcess == 0 || lim.OpenFileBytes == 0 || lim.HostFileMax == 0 {
		t.Fatalf("GET /v1/info does not say the open-file budget: %+v", lim)
	}
	ca, a, cb, b := tenantSessions(t)
	// Processes of 4 threads' worth of the pids limit, each opening
	// /dev/null until it fails (its own limit, or the sandbox's memory).
	held := hostileHolder(t, ca, a, `
import os, time
total = 0
kids = []
for _ in range(96):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        n = 0
        try:
            while True:
                os.open("/dev/null", os.O_RDONLY)
                n += 1
        except OSError:
            pass
        os.write(w, b"%d\n" % n)
        time.sleep(300)
        os._exit(0)
    os.close(w)
    kids.append(r)
for r in kids:
    line = os.read(r, 64)
    if line:
        total += int(line)
print(total, flush=True)
time.sleep(300)
`)
	n, _ := strconv.ParseInt(strings.Fields(held)[0], 10, 64)
	nr, max := hostFiles(t)
	t.Logf("tenant A's sandbox holds %d open files; the host's table: %d of %d", n, nr, max)
	if max-nr < 1<<20 {
		t.Errorf("a default-size sandbox holding %d files left the host %d free entries of %d", n, max-nr, max)
	}
	if budget := int64(info.Limits.DefaultMemoryMB<<20) / lim.OpenFileBytes; n > budget+budget/10 {
		t.Errorf("the sandbox held %d files, over its memory-bound budget of %d", n, budget)
	}
	if got := pyOut(t, cb, b, `
import os
fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(1000)]
print(len(fds))
`); got != "1000" {
		t.Errorf("with tenant A holding %d files, tenant B could not open 1000: %s", n, got)
	}
}

// hostFiles reads the host's open-file count and table size.
func hostFiles(t *testing.T) (nr, max int64) {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/fs/file-nr")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	nr, _ = strconv.ParseInt(f[0], 10, 64)
	max, _ = strconv.ParseInt(f[2], 10, 64)
	return nr, max
}

// needIDMappedStorage skips t on the overlay storage driver, whose
// filesystem cannot be id-mapped: there sandboxes keep the shared storage
// host ids (a documented limit), so per-uid kernel limits are shared.
func needIDMappedStorage(t *testing.T) {
	t.Helper()
	if env.d.StorageDriver() == "overlay" {
		t.Skip("overlayfs cannot be id-mapped: sandboxes on the overlay driver share the storage host ids (see Known limits)")
	}
}

// TestDataDirUnderClosedDirectory: a data directory under a directory
// others cannot pass (as under /root, 0700) made every create a bare 500
// "permission denied" from runc; the daemon now refuses to start and says
// why.
func TestDataDirUnderClosedDirectory(t *testing.T) {
	need(t)
	closed, err := os.MkdirTemp("", "forkbox-closed-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(closed)
	if err := os.Chmod(closed, 0o700); err != nil {
		t.Fatal(err)
	}
	d, err := startDaemon(closed + "/data")
	if err == nil {
		d.Shutdown(ctxFor(t, time.Minute))
		t.Fatal("a daemon started on a data directory sandboxes cannot reach")
	}
	if !strings.Contains(err.Error(), closed) || !strings.Contains(err.Error(), "cannot pass") {
		t.Fatalf("the error does not say which directory is in the way: %v", err)
	}
}
