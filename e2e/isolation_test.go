package e2e

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestIsolationProcesses proves a sandbox sees only its own processes: the
// agent as pid 1 and what it started, none of the host's.
func TestIsolationProcesses(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	out := sh(t, s.ID, "ps -eo pid=,comm=")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) > 4 {
		t.Fatalf("sandbox sees %d processes, want only its own:\n%s", len(lines), out)
	}
	if !strings.Contains(lines[0], "1 forkbox-agent") {
		t.Fatalf("pid 1 is not the agent:\n%s", out)
	}
	if strings.Contains(out, filepath.Base(os.Args[0])) {
		t.Fatalf("the host's test process is visible:\n%s", out)
	}
}

// TestIsolationCanaryFile proves host files outside the read-only system
// directories are invisible: a canary in the host's /tmp, /root and /etc.
func TestIsolationCanaryFile(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	name := fmt.Sprintf("forkbox-canary-%d", time.Now().UnixNano())
	var paths []string
	for _, dir := range []string{"/tmp", "/root", "/etc", "/var/tmp"} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("secret"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(p) })
		paths = append(paths, p)
	}
	for _, p := range paths {
		res, out, _ := run(t, s.ID, client.ExecRequest{Argv: []string{"cat", p}, User: "root"})
		if res.ExitCode == 0 || strings.Contains(out, "secret") {
			t.Errorf("host canary %s is readable in the sandbox: %q", p, out)
		}
	}
}

// TestIsolationHostLoopback proves a TCP listener on the host's loopback
// (and on the host's other addresses) is unreachable: the sandbox has its
// own network namespace with only lo.
func TestIsolationHostLoopback(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host-secret\n"))
			c.Close()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	targets := []string{"127.0.0.1"}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && !ipn.IP.IsLoopback() {
				targets = append(targets, ipn.IP.String())
			}
		}
	}
	for _, host := range targets {
		script := fmt.Sprintf(`
import socket
s = socket.socket()
s.settimeout(3)
try:
    s.connect((%q, %d))
    print("CONNECTED", s.recv(100))
except OSError as e:
    print("refused", e)
`, host, port)
		_, out, _ := run(t, s.ID, client.ExecRequest{Argv: []string{"python3", "-c", script}})
		if strings.Contains(out, "CONNECTED") || strings.Contains(out, "host-secret") {
			t.Errorf("sandbox reached the host listener at %s:%d: %s", host, port, out)
		}
	}
	links := sh(t, s.ID, "ls /sys/class/net")
	if strings.TrimSpace(links) != "lo" {
		t.Errorf("network interfaces in the sandbox = %q, want only lo", links)
	}
}

// TestIsolationHostname proves the hostname is the session id.
func TestIsolationHostname(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	if got := strings.TrimSpace(sh(t, s.ID, "hostname")); got != s.ID {
		t.Fatalf("hostname = %q, want %q", got, s.ID)
	}
	if got := strings.TrimSpace(sh(t, s.ID, "cat /etc/hostname")); got != s.ID {
		t.Fatalf("/etc/hostname = %q, want %q", got, s.ID)
	}
}

// TestReadOnlyRoot proves writes outside the home directory and /tmp fail,
// even for root, while home and /tmp are writable.
func TestReadOnlyRoot(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	for _, p := range []string{"/etc/x", "/usr/x", "/x", "/var/x", "/.forkbox/x", "/usr/bin/python3"} {
		res, _, errOut := run(t, s.ID, client.ExecRequest{Argv: []string{"sh", "-c", "echo hi > " + p}, User: "root"})
		if res.ExitCode == 0 {
			t.Errorf("root wrote %s", p)
		} else if !strings.Contains(errOut, "Read-only") && !strings.Contains(errOut, "ermission") {
			t.Errorf("writing %s failed oddly: %q", p, errOut)
		}
	}
	sh(t, s.ID, "echo ok > /home/user/a && echo ok > /tmp/b && cat /home/user/a /tmp/b")
	res, _, _ := run(t, s.ID, client.ExecRequest{Cmd: "echo ok > /root/c", User: "root"})
	if res.ExitCode != 0 {
		t.Errorf("root cannot write its home /root")
	}
}

// TestNoHostSecrets proves the sandbox's /etc is synthesized: no shadow
// file, no host accounts, no host ssh keys.
func TestNoHostSecrets(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	res, _, _ := run(t, s.ID, client.ExecRequest{Argv: []string{"ls", "/etc/shadow", "/etc/ssh", "/etc/gshadow"}, User: "root"})
	if res.ExitCode == 0 {
		t.Fatal("/etc/shadow or host ssh configuration is visible")
	}
	passwd := sh(t, s.ID, "cat /etc/passwd")
	for _, line := range strings.Split(strings.TrimSpace(passwd), "\n") {
		name := strings.SplitN(line, ":", 2)[0]
		if name != "root" && name != "user" && name != "nobody" {
			t.Errorf("unexpected account %q in /etc/passwd", name)
		}
	}
}

// TestRootIsUnprivilegedOnHost proves root in a sandbox is an unprivileged
// uid on the host (user namespace), and processes run with no_new_privs,
// a seccomp filter and the minimal capability set.
func TestRootIsUnprivilegedOnHost(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	status := sh(t, s.ID, "cat /proc/self/status")
	for _, want := range []string{"NoNewPrivs:\t1", "Seccomp:\t2", "CapEff:\t0000000000000000"} {
		if !strings.Contains(status, want) {
			t.Errorf("default user's status lacks %q", want)
		}
	}
	res, rootStatus, _ := run(t, s.ID, client.ExecRequest{Argv: []string{"cat", "/proc/self/status"}, User: "root"})
	if res.ExitCode != 0 || !strings.Contains(rootStatus, "CapEff:\t00000000000004fb") {
		t.Errorf("root's effective capabilities are not the documented minimal set:\n%s", grep(rootStatus, "Cap"))
	}
	res, _, errOut := run(t, s.ID, client.ExecRequest{Argv: []string{"mount", "-t", "tmpfs", "none", "/mnt"}, User: "root"})
	if res.ExitCode == 0 {
		t.Error("root could mount a filesystem")
	}
	_ = errOut

	// Find the sandbox's processes on the host: their host uid is shifted.
	pid, err := env.c.ExecBackground(ctxFor(t, time.Minute), s.ID, client.ExecRequest{Argv: []string{"sleep", "30"}, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	defer env.c.Kill(ctxFor(t, time.Minute), s.ID, pid)
	procs, err := os.ReadFile(cgroupFile(t, "pids", s.ID, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, f := range strings.Fields(string(procs)) {
		b, err := os.ReadFile("/proc/" + f + "/status")
		if err != nil {
			continue
		}
		st := string(b)
		if !strings.Contains(st, "Name:\tsleep") {
			continue
		}
		found = true
		uidLine := grep(st, "Uid:")
		uid, _ := strconv.Atoi(strings.Fields(uidLine)[1])
		// Root of each sandbox is the first id of the sandbox's own
		// slice of host ids (package userns), never a host account.
		if env.d.StorageDriver() == "overlay" {
			// overlayfs cannot be id-mapped: the storage ids.
			if uid != 100000 {
				t.Errorf("sandbox root on overlay storage is host uid %d, want 100000 (%s)", uid, uidLine)
			}
		} else if uid < 0x70000000 || (uid-0x70000000)%65536 != 0 {
			t.Errorf("sandbox root is host uid %d, want the first id of a slice from 0x70000000 (%s)", uid, uidLine)
		}
	}
	if !found {
		t.Fatal("did not find the sandbox's sleep process on the host")
	}
}

func grep(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
