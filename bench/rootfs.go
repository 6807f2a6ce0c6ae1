package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// busyboxPath is the static busybox the peers' root filesystem is made of
// (Debian's busybox-static package).
const busyboxPath = "/bin/busybox"

// busyboxApplets are the commands linked to busybox in the root filesystem.
var busyboxApplets = []string{"sh", "true", "sleep", "head", "sync"}

// cgroupParent is the cgroup, in every hierarchy, under which the runc
// peer's containers are placed.
const cgroupParent = "forkbox-bench"

// buildRootFS makes a minimal root filesystem in dir: bin/busybox, a copy
// of busyboxPath, and busyboxApplets (bin/sh, bin/true, ...) linked to it.
func buildRootFS(dir string) error {
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return fmt.Errorf("root filesystem: %w", err)
	}
	src, err := os.Open(busyboxPath)
	if err != nil {
		return fmt.Errorf("root filesystem needs a static busybox (apt-get install busybox-static): %w", err)
	}
	defer src.Close()
	dst, err := os.OpenFile(filepath.Join(bin, "busybox"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return fmt.Errorf("root filesystem: %w", err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return fmt.Errorf("copy busybox: %w", err)
	}
	if err := dst.Close(); err != nil {
		return fmt.Errorf("copy busybox: %w", err)
	}
	for _, applet := range busyboxApplets {
		if err := os.Symlink("busybox", filepath.Join(bin, applet)); err != nil {
			return fmt.Errorf("root filesystem: %w", err)
		}
	}
	return nil
}

// writeBundle writes bundle/config.json: a container like the one `runc
// spec` describes (namespaces, mounts, masked paths, the three default
// capabilities, no terminal) running args on the read-only rootfs, in
// cgroup /cgroupParent/name.
func writeBundle(bundle, rootfs, name string, args []string) error {
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return fmt.Errorf("bundle: %w", err)
	}
	b, err := json.MarshalIndent(runcSpec(rootfs, name, args), "", "\t")
	if err != nil {
		return fmt.Errorf("bundle config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600); err != nil {
		return fmt.Errorf("bundle config: %w", err)
	}
	return nil
}

// runcSpec returns the OCI configuration written by writeBundle.
func runcSpec(rootfs, name string, args []string) *specs.Spec {
	caps := []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}
	return &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{
			Terminal: false,
			User:     specs.User{UID: 0, GID: 0},
			Args:     args,
			Env:      []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Cwd:      "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding: caps, Effective: caps, Permitted: caps,
			},
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}},
			NoNewPrivileges: true,
		},
		Root:     &specs.Root{Path: rootfs, Readonly: true},
		Hostname: name,
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs",
				Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts",
				Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm",
				Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue",
				Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs",
				Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		},
		Linux: &specs.Linux{
			CgroupsPath: "/" + cgroupParent + "/" + name,
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
			},
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
			MaskedPaths: []string{
				"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi",
			},
			ReadonlyPaths: []string{
				"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
			},
		},
	}
}

// removeCgroupParent removes the empty /cgroupParent cgroup that runc
// leaves in every hierarchy. Hierarchies where it is missing or still in
// use are skipped.
func removeCgroupParent() {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", cgroupParent))
	dirs = append(dirs, filepath.Join("/sys/fs/cgroup", cgroupParent))
	for _, d := range dirs {
		_ = os.Remove(d) // rmdir; fails harmlessly when busy or gone
	}
}

// removeTree removes dir recursively unless something is mounted on or
// under it (a sandbox or container that outlived its cleanup): then it
// leaves dir in place and says so.
func removeTree(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	if len(mounts) > 0 {
		return fmt.Errorf("kept %s: %d mount(s) under it, e.g. %s", dir, len(mounts), mounts[0])
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// unmountStorage unmounts the storage volumes a daemon mounted under
// dataDir/storage (loop-mounted images, which it keeps mounted after it
// stops), deepest first. Call it only once no sandbox uses them. A volume
// that is still busy is detached lazily: a stopped in-process daemon can
// keep a descriptor open on it (its storage driver is not closed by
// Shutdown); the kernel frees it, and the loop device, when that closes.
func unmountStorage(dataDir string) error {
	if entries, err := os.ReadDir(filepath.Join(dataDir, "sandboxes")); err == nil && len(entries) > 0 {
		return fmt.Errorf("kept %s: %d sandbox(es) left in it", dataDir, len(entries))
	}
	mounts, err := mountsUnder(filepath.Join(dataDir, "storage"))
	if err != nil {
		return err
	}
	for i := len(mounts) - 1; i >= 0; i-- {
		err := unix.Unmount(mounts[i], 0)
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(mounts[i], unix.MNT_DETACH)
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", mounts[i], err)
		}
	}
	return nil
}

// mountsUnder returns the mount points at or below dir in this process's
// mount namespace.
func mountsUnder(dir string) ([]string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("mounts under %s: %w", dir, err)
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("mounts under %s: %w", dir, err)
	}
	defer f.Close()
	var found []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// Field 5 is the mount point, with spaces and such octal-escaped.
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMountPoint(fields[4])
		if mp == abs || strings.HasPrefix(mp, abs+"/") {
			found = append(found, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("mounts under %s: %w", dir, err)
	}
	return found, nil
}

// unescapeMountPoint decodes the \NNN octal escapes of a mountinfo field.
func unescapeMountPoint(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// isOctal reports whether c is an octal digit.
func isOctal(c byte) bool { return c >= '0' && c <= '7' }
