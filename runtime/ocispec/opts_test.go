package ocispec

import (
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/runtime"
)

func baseConfig() runtime.Config {
	return runtime.Config{ID: "sb1", RootFS: "/rootfs", AgentPath: "/host/agent",
		Limits: runtime.Limits{CPU: 1.5, MemoryBytes: 256 << 20, Pids: 100}}
}

func nsTypes(s *specs.Spec) []specs.LinuxNamespaceType {
	var out []specs.LinuxNamespaceType
	for _, n := range s.Linux.Namespaces {
		out = append(out, n.Type)
	}
	return out
}

func nsPath(s *specs.Spec, t specs.LinuxNamespaceType) (string, bool) {
	for _, n := range s.Linux.Namespaces {
		if n.Type == t {
			return n.Path, true
		}
	}
	return "", false
}

func mountAt(s *specs.Spec, dest string) *specs.Mount {
	for i := range s.Mounts {
		if s.Mounts[i].Destination == dest {
			return &s.Mounts[i]
		}
	}
	return nil
}

// TestBuildBase: the spec every sandbox starts from has every namespace
// new (no user namespace without id maps), the minimal capability set in
// all three sets, no_new_privs, a read-only root, the kernel filesystems
// and the agent read-only, a seccomp profile, no device access, the
// limits asked for and the default rlimits set by the runtime.
func TestBuildBase(t *testing.T) {
	s, err := Build(baseConfig())
	if err != nil {
		t.Fatal(err)
	}
	want := []specs.LinuxNamespaceType{specs.PIDNamespace, specs.NetworkNamespace, specs.IPCNamespace,
		specs.UTSNamespace, specs.MountNamespace, specs.CgroupNamespace}
	if got := nsTypes(s); !slices.Equal(got, want) {
		t.Errorf("namespaces %v, want %v", got, want)
	}
	for _, n := range s.Linux.Namespaces {
		if n.Path != "" {
			t.Errorf("namespace %s joins %s", n.Type, n.Path)
		}
	}
	c := s.Process.Capabilities
	for name, set := range map[string][]string{"bounding": c.Bounding, "effective": c.Effective, "permitted": c.Permitted} {
		if !slices.Equal(set, Capabilities) {
			t.Errorf("%s capabilities %v, want %v", name, set, Capabilities)
		}
	}
	if len(c.Inheritable) != 0 || len(c.Ambient) != 0 {
		t.Errorf("inheritable %v, ambient %v: want none", c.Inheritable, c.Ambient)
	}
	for _, bad := range []string{"CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_SYS_PTRACE", "CAP_MKNOD"} {
		if slices.Contains(c.Bounding, bad) {
			t.Errorf("%s is in the bounding set", bad)
		}
	}
	if !s.Process.NoNewPrivileges || !s.Root.Readonly || s.Root.Path != "/rootfs" || s.Hostname != "sb1" {
		t.Errorf("no_new_privs %v, root %+v, hostname %q", s.Process.NoNewPrivileges, s.Root, s.Hostname)
	}
	if s.Process.Args[0] != runtime.AgentTarget {
		t.Errorf("init %v, want the agent", s.Process.Args)
	}
	agent := mountAt(s, runtime.AgentTarget)
	if agent == nil || agent.Source != "/host/agent" || !slices.Contains(agent.Options, "ro") {
		t.Errorf("agent mount %+v", agent)
	}
	for _, dest := range []string{"/sys", "/sys/fs/cgroup"} {
		if m := mountAt(s, dest); m == nil || !slices.Contains(m.Options, "ro") {
			t.Errorf("%s is not mounted read-only: %+v", dest, m)
		}
	}
	if m := mountAt(s, "/proc"); m == nil || m.Type != "proc" {
		t.Errorf("/proc %+v", m)
	}
	if s.Linux.Seccomp == nil || s.Linux.Seccomp.DefaultAction == specs.ActAllow {
		t.Errorf("seccomp %+v, want a denying default", s.Linux.Seccomp)
	}
	if !slices.Contains(s.Linux.MaskedPaths, "/proc/kcore") || !slices.Contains(s.Linux.ReadonlyPaths, "/proc/sys") {
		t.Errorf("masked %v, read-only %v", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
	}
	r := s.Linux.Resources
	if len(r.Devices) != 1 || r.Devices[0].Allow || r.Devices[0].Access != "rwm" {
		t.Errorf("devices %+v, want all denied", r.Devices)
	}
	if *r.CPU.Quota != 150000 || *r.CPU.Period != 100000 {
		t.Errorf("cpu quota %d/%d, want 150000/100000", *r.CPU.Quota, *r.CPU.Period)
	}
	if *r.Memory.Limit != 256<<20 || *r.Memory.Swap != 256<<20 {
		t.Errorf("memory %d swap %d, want both 256 MiB", *r.Memory.Limit, *r.Memory.Swap)
	}
	if *r.Pids.Limit != 100 {
		t.Errorf("pids %d, want 100", *r.Pids.Limit)
	}
	if s.Linux.CgroupsPath != "/forkbox/sb1" {
		t.Errorf("cgroups path %q", s.Linux.CgroupsPath)
	}
	var kinds []string
	for _, rl := range s.Process.Rlimits {
		kinds = append(kinds, rl.Type)
		if rl.Type == "RLIMIT_CORE" && (rl.Soft != 0 || rl.Hard != 0) {
			t.Errorf("core dumps allowed: %+v", rl)
		}
		if rl.Type == "RLIMIT_NOFILE" && (rl.Hard == 0 || rl.Hard > maxNofile) {
			t.Errorf("open files %+v, want 1..%d", rl, maxNofile)
		}
	}
	if !slices.Equal(kinds, []string{"RLIMIT_NOFILE", "RLIMIT_CORE"}) {
		t.Errorf("rlimits %v", kinds)
	}
}

// TestBuildConfig: what the config names is in the spec: joined network
// and user namespaces with their id maps, bind mounts in order, rlimits
// the agent sets itself when the runtime cannot (a joined user
// namespace), and bad configs refused.
func TestBuildConfig(t *testing.T) {
	cfg := baseConfig()
	cfg.NetnsPath = "/run/netns/x"
	cfg.UserNamespace = "/state/userns"
	idmap := []runtime.IDMap{{ContainerID: 0, HostID: 0x70000000, Size: 65536}}
	cfg.UIDMap, cfg.GIDMap = idmap, idmap
	cfg.Mounts = []runtime.Mount{{Source: "/a", Target: "/home/user"}, {Source: "/b", Target: "/data", ReadOnly: true}}
	cfg.Rlimits = runtime.Rlimits{{Resource: "RLIMIT_NOFILE", Soft: 1024, Hard: 2048}}
	s, err := Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p, ok := nsPath(s, specs.NetworkNamespace); !ok || p != "/run/netns/x" {
		t.Errorf("network namespace %q %v", p, ok)
	}
	if p, ok := nsPath(s, specs.UserNamespace); !ok || p != "/state/userns" {
		t.Errorf("user namespace %q %v", p, ok)
	}
	if len(s.Linux.UIDMappings) != 1 || s.Linux.UIDMappings[0].HostID != 0x70000000 || s.Linux.GIDMappings[0].Size != 65536 {
		t.Errorf("id maps %+v %+v", s.Linux.UIDMappings, s.Linux.GIDMappings)
	}
	if m := mountAt(s, "/sys"); m == nil || m.Type != "tmpfs" {
		t.Errorf("/sys with a joined network namespace: %+v, want a tmpfs", m)
	}
	home, data := mountAt(s, "/home/user"), mountAt(s, "/data")
	if home == nil || home.Source != "/a" || slices.Contains(home.Options, "ro") || !slices.Contains(home.Options, "nosuid") {
		t.Errorf("/home/user %+v", home)
	}
	if data == nil || !slices.Contains(data.Options, "ro") {
		t.Errorf("/data %+v", data)
	}
	if len(s.Process.Rlimits) != 0 {
		t.Errorf("rlimits for the runtime %v, want none (the agent sets them)", s.Process.Rlimits)
	}
	if !slices.Contains(s.Process.Env, runtime.AgentRlimitsEnv+"=RLIMIT_NOFILE=1024:2048") {
		t.Errorf("env %v lacks the agent's rlimits", s.Process.Env)
	}

	for name, change := range map[string]func(*runtime.Config){
		"no pids":             func(c *runtime.Config) { c.Limits.Pids = 0 },
		"negative cpu":        func(c *runtime.Config) { c.Limits.CPU = -1 },
		"userns without maps": func(c *runtime.Config) { c.UserNamespace = "/u" },
		"relative mount":      func(c *runtime.Config) { c.Mounts = []runtime.Mount{{Source: "a", Target: "/a"}} },
	} {
		c := baseConfig()
		change(&c)
		if _, err := Build(c); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestOptions: each option changes what it says and nothing else it
// should not, options run in order, and an option's error fails Build.
func TestOptions(t *testing.T) {
	base, err := Build(baseConfig())
	if err != nil {
		t.Fatal(err)
	}
	s, err := Build(baseConfig(),
		WithCgroupsPath("/forkbox-x/sb1"),
		WithoutNamespace(specs.CgroupNamespace),
		WithoutSeccomp(),
		WithMemoryHeadroom(96<<20),
		WithRlimit("RLIMIT_NPROC", 10, 20),
		WithMounts(specs.Mount{Destination: "/.forkbox/run", Type: "bind", Source: "/host/run"}),
		WithEnv("A=1"), WithEnv("B=2"),
		WithAgentCapabilities("CAP_SYS_ADMIN"),
	)
	if err != nil {
		t.Fatal(err)
	}
	if s.Linux.CgroupsPath != "/forkbox-x/sb1" {
		t.Errorf("cgroups path %q", s.Linux.CgroupsPath)
	}
	if _, ok := nsPath(s, specs.CgroupNamespace); ok || len(s.Linux.Namespaces) != len(base.Linux.Namespaces)-1 {
		t.Errorf("namespaces %v", nsTypes(s))
	}
	if s.Linux.Seccomp != nil {
		t.Error("seccomp is still set")
	}
	if *s.Linux.Resources.Memory.Limit != (256+96)<<20 || *s.Linux.Resources.Memory.Swap != (256+96)<<20 {
		t.Errorf("memory %d swap %d", *s.Linux.Resources.Memory.Limit, *s.Linux.Resources.Memory.Swap)
	}
	last := s.Process.Rlimits[len(s.Process.Rlimits)-1]
	if last != (specs.POSIXRlimit{Type: "RLIMIT_NPROC", Soft: 10, Hard: 20}) {
		t.Errorf("last rlimit %+v", last)
	}
	if s.Mounts[len(s.Mounts)-1].Destination != "/.forkbox/run" || len(s.Mounts) != len(base.Mounts)+1 {
		t.Errorf("mounts %+v", s.Mounts)
	}
	if env := s.Process.Env; len(env) < 2 || env[len(env)-2] != "A=1" || env[len(env)-1] != "B=2" {
		t.Errorf("env %v, want A=1 then B=2 last", env)
	}
	c := s.Process.Capabilities
	if !slices.Contains(c.Effective, "CAP_SYS_ADMIN") || !slices.Contains(c.Permitted, "CAP_SYS_ADMIN") {
		t.Errorf("effective %v permitted %v lack CAP_SYS_ADMIN", c.Effective, c.Permitted)
	}
	if slices.Contains(c.Bounding, "CAP_SYS_ADMIN") {
		t.Error("CAP_SYS_ADMIN is in the bounding set: programs the agent runs could have it")
	}
	if slices.Contains(Capabilities, "CAP_SYS_ADMIN") {
		t.Error("the option changed the package's capability list")
	}

	for name, opt := range map[string]SpecOpts{
		"relative cgroups path": WithCgroupsPath("forkbox/sb1"),
		"negative headroom":     WithMemoryHeadroom(-1),
		"soft above hard":       WithRlimit("RLIMIT_NPROC", 2, 1),
		"relative mount":        WithMounts(specs.Mount{Destination: "run"}),
	} {
		if _, err := Build(baseConfig(), opt); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// Options run in order: a later one sees what an earlier one did.
	s, err = Build(baseConfig(), WithMemoryHeadroom(1), WithMemoryHeadroom(2))
	if err != nil || *s.Linux.Resources.Memory.Limit != 256<<20+3 {
		t.Errorf("two headrooms: %v %v", s.Linux.Resources.Memory.Limit, err)
	}
}
