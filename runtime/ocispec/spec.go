// Package ocispec builds the OCI runtime spec of a sandbox from a
// runtime.Config, for the drivers that run one through an OCI runtime CLI
// (runc, runsc). Build makes the spec every sandbox starts from (the runc
// tier's, the strictest); a driver changes it with SpecOpts, applied in
// order after the base is complete (the way containerd's spec options
// work), so neither driver needs the other's code.
package ocispec

import (
	"fmt"
	"path/filepath"
	goruntime "runtime"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/runtime/cgroupv1"
)

// Capabilities is the documented minimal set every sandbox keeps (inside its
// user namespace, so they never apply to host objects):
//
//   - CAP_CHOWN, CAP_FOWNER, CAP_FSETID, CAP_DAC_OVERRIDE: the agent writes
//     files for the exec user and hands them over (chown); root in the
//     sandbox can manage its own files.
//   - CAP_SETUID, CAP_SETGID: the agent drops to the exec user (uid 1000).
//   - CAP_KILL: the agent signals processes it started for other users.
//   - CAP_NET_BIND_SERVICE: root in the sandbox may listen on ports < 1024.
//
// Everything else (SYS_ADMIN, NET_RAW, MKNOD, SYS_CHROOT, SETFCAP, AUDIT_WRITE,
// SYS_PTRACE, ...) is dropped. Processes started as a non-root user get none.
var Capabilities = []string{
	"CAP_CHOWN",
	"CAP_DAC_OVERRIDE",
	"CAP_FOWNER",
	"CAP_FSETID",
	"CAP_KILL",
	"CAP_SETGID",
	"CAP_SETUID",
	"CAP_NET_BIND_SERVICE",
}

// maskedPaths are hidden inside the sandbox (an empty file or directory is
// mounted over them); readonlyPaths are remounted read-only. The lists match
// what runc's and Docker's defaults hide: kernel memory, keyrings, timers,
// firmware and the knobs under /proc/sys.
var (
	maskedPaths = []string{
		"/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys",
		"/proc/latency_stats", "/proc/timer_list", "/proc/timer_stats",
		"/proc/sched_debug", "/proc/scsi", "/sys/firmware", "/sys/devices/virtual/powercap",
	}
	readonlyPaths = []string{
		"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
	}
)

// cpuPeriodUS is the CFS period the CPU quota is expressed in, in µs
// (the one cgroupv1.SetLimits writes too).
const cpuPeriodUS = cgroupv1.CPUPeriodUS

// AgentOOMScoreAdj is the agent's oom_score_adj, written by the runtime
// with the host's privilege (which also makes it the floor for everything
// the agent starts: a process may lower its own score only down to what
// its ancestors were given that way). The agent raises every process it
// starts to 1000, so the kernel's OOM killer takes user code first. 0, not
// a negative value: code that lowers itself to the floor must not be
// preferred over host processes when the host itself runs out of memory,
// and the sandbox must not inherit the daemon's own score (a daemon run
// with a negative one would hand it down). In the gVisor tier runsc gives
// this score to the Sentry and the gofer; inside, the Sentry kills no
// single process (going over the limit stops the sandbox).
const AgentOOMScoreAdj = 0

// Build returns the OCI runtime spec for cfg: every namespace new (pid,
// mount, ipc, uts, net with loopback only, cgroup, and user when cfg has id
// maps) except those cfg names (NetnsPath, UserNamespace), a read-only
// root, the minimal capability set, no_new_privs, the default seccomp
// profile, masked /proc and /sys paths, cgroup v1 limits under
// cgroupv1.LegacyParent (WithCgroupsPath changes it) and cfg.Rlimits
// (by default RLIMIT_NOFILE at most 65536 and no core dumps), then opts
// in order. Errors: limits that are not all positive, a user namespace
// without id maps, a relative mount path, and the first error of an
// option.
func Build(cfg runtime.Config, opts ...SpecOpts) (*specs.Spec, error) {
	if cfg.Limits.CPU <= 0 || cfg.Limits.MemoryBytes <= 0 || cfg.Limits.Pids <= 0 {
		return nil, fmt.Errorf("limits must all be positive, got %+v", cfg.Limits)
	}
	caps := append([]string(nil), Capabilities...)
	quota := int64(cfg.Limits.CPU * cpuPeriodUS)
	period := uint64(cpuPeriodUS)
	mem := cfg.Limits.MemoryBytes
	swap := mem // memory+swap == memory: no swap beyond the memory limit
	pids := cfg.Limits.Pids
	noOOMKillDisable := false
	rlimits := cfg.Rlimits
	if len(rlimits) == 0 {
		nofile := nofileLimit()
		rlimits = runtime.Rlimits{{Resource: "RLIMIT_NOFILE", Soft: nofile, Hard: nofile}, {Resource: "RLIMIT_CORE"}}
	}
	env := cfg.AgentEnv
	var specRlimits []specs.POSIXRlimit
	if cfg.UserNamespace != "" {
		// runc would set them with prlimit(2) from outside the joined
		// namespace, which needs CAP_SYS_RESOURCE over it: the agent
		// sets them on itself before it runs anything.
		env = append(append([]string(nil), env...), runtime.AgentRlimitsEnv+"="+rlimits.String())
	} else {
		for _, r := range rlimits {
			specRlimits = append(specRlimits, specs.POSIXRlimit{Type: r.Resource, Soft: r.Soft, Hard: r.Hard})
		}
	}
	oomScoreAdj := AgentOOMScoreAdj

	s := &specs.Spec{
		Version:  specs.Version,
		Hostname: cfg.ID,
		Root:     &specs.Root{Path: cfg.RootFS, Readonly: !cfg.WritableRoot},
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: append([]string{runtime.AgentTarget}, cfg.AgentArgs...),
			Env:  env,
			Cwd:  "/",
			Capabilities: &specs.LinuxCapabilities{
				Bounding:  caps,
				Effective: caps,
				Permitted: caps,
			},
			Rlimits:         specRlimits,
			NoNewPrivileges: true,
			OOMScoreAdj:     &oomScoreAdj,
		},
		Mounts: baseMounts(),
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace},
				{Type: specs.IPCNamespace}, {Type: specs.UTSNamespace},
				{Type: specs.MountNamespace}, {Type: specs.CgroupNamespace},
			},
			CgroupsPath: "/" + cgroupv1.LegacyParent + "/" + cfg.ID, // drivers put in their own parent (WithCgroupsPath)
			Resources: &specs.LinuxResources{
				Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
				CPU:     &specs.LinuxCPU{Quota: &quota, Period: &period},
				Memory: &specs.LinuxMemory{
					Limit: &mem, Swap: &swap, DisableOOMKiller: &noOOMKillDisable,
				},
				Pids: &specs.LinuxPids{Limit: &pids},
			},
			MaskedPaths:   maskedPaths,
			ReadonlyPaths: readonlyPaths,
		},
	}
	if cfg.NetnsPath != "" {
		for i := range s.Linux.Namespaces {
			if s.Linux.Namespaces[i].Type == specs.NetworkNamespace {
				s.Linux.Namespaces[i].Path = cfg.NetnsPath
			}
		}
		// The kernel mounts sysfs only for the user namespace that owns
		// the network namespace, which a joined one may not be (netpolicy
		// makes host-owned ones for sandboxes without an identity of
		// their own), and a sandbox has no use for the host's devices:
		// /sys is a small empty tmpfs instead, with the cgroup tree still
		// under it.
		for i := range s.Mounts {
			if s.Mounts[i].Destination == "/sys" {
				s.Mounts[i] = specs.Mount{Destination: "/sys", Type: "tmpfs", Source: "sysfs",
					Options: []string{"nosuid", "noexec", "nodev", "mode=755", "size=64k"}}
			}
		}
	}
	if cfg.UserNamespace != "" && len(cfg.UIDMap) == 0 {
		return nil, fmt.Errorf("user namespace %s: its id maps are needed too", cfg.UserNamespace)
	}
	if len(cfg.UIDMap) > 0 {
		s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace, Path: cfg.UserNamespace})
		s.Linux.UIDMappings = idMappings(cfg.UIDMap)
		s.Linux.GIDMappings = idMappings(cfg.GIDMap)
	}
	for _, m := range cfg.Mounts {
		if !filepath.IsAbs(m.Source) || !filepath.IsAbs(m.Target) {
			return nil, fmt.Errorf("mount %s -> %s: paths must be absolute", m.Source, m.Target)
		}
		opts := []string{"bind", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		s.Mounts = append(s.Mounts, specs.Mount{
			Destination: m.Target, Type: "bind", Source: m.Source, Options: opts,
		})
	}
	s.Mounts = append(s.Mounts, specs.Mount{
		Destination: runtime.AgentTarget, Type: "bind", Source: cfg.AgentPath,
		Options: []string{"bind", "ro", "nosuid", "nodev"},
	})
	profile, err := seccomp.GetDefaultProfile(s)
	if err != nil {
		return nil, fmt.Errorf("default seccomp profile: %w", err)
	}
	// Only the native system call ABI: the compatibility ABIs (32-bit x86
	// through int 0x80, x32) are a classic kernel attack surface that agent
	// code has no use for. Fewer architectures also make runc compile the
	// filter about 25 ms faster per sandbox.
	if arch, ok := nativeSeccompArch[goruntime.GOARCH]; ok {
		profile.Architectures = []specs.Arch{arch}
	}
	restrictIoctl(profile)
	s.Linux.Seccomp = profile
	for _, o := range opts {
		if err := o(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// maxNofile is the open-files limit of sandbox processes, lowered to the
// daemon's own hard limit when that is smaller (raising it would need
// CAP_SYS_RESOURCE on the host).
const maxNofile = 65536

func nofileLimit() uint64 {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil && rl.Max < maxNofile {
		return rl.Max
	}
	return maxNofile
}

// baseMounts are the kernel filesystems every sandbox gets. /sys and the
// cgroup tree are read-only; /dev is a small tmpfs that runc fills with the
// default device nodes (null, zero, full, random, urandom, tty).
func baseMounts() []specs.Mount {
	return []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
		{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
		{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
	}
}

func idMappings(m []runtime.IDMap) []specs.LinuxIDMapping {
	out := make([]specs.LinuxIDMapping, len(m))
	for i, e := range m {
		out[i] = specs.LinuxIDMapping{ContainerID: e.ContainerID, HostID: e.HostID, Size: e.Size}
	}
	return out
}
