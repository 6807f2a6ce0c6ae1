package ocispec

import (
	"fmt"
	"path/filepath"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// SpecOpts changes a spec Build has made; it returns an error when it
// cannot apply to that spec. Options run in the order given, after the
// base spec (seccomp profile included) is complete.
type SpecOpts func(*specs.Spec) error

// WithCgroupsPath sets the sandbox's cgroup path, relative to each
// hierarchy's root ("/PARENT/ID": cgroupv1.Cgroups.SpecPath).
func WithCgroupsPath(path string) SpecOpts {
	return func(s *specs.Spec) error {
		if !filepath.IsAbs(path) {
			return fmt.Errorf("cgroups path %q: must be absolute", path)
		}
		s.Linux.CgroupsPath = path
		return nil
	}
}

// WithoutNamespace removes the namespace of type t, so that the sandbox
// shares the runtime's (gVisor: the cgroup namespace, which its Sentry
// provides itself). Removing one that is not there is no change.
func WithoutNamespace(t specs.LinuxNamespaceType) SpecOpts {
	return func(s *specs.Spec) error {
		var ns []specs.LinuxNamespace
		for _, n := range s.Linux.Namespaces {
			if n.Type != t {
				ns = append(ns, n)
			}
		}
		s.Linux.Namespaces = ns
		return nil
	}
}

// WithoutSeccomp removes the seccomp profile: for runtimes that filter
// system calls themselves (gVisor's Sentry serves every one).
func WithoutSeccomp() SpecOpts {
	return func(s *specs.Spec) error {
		s.Linux.Seccomp = nil
		return nil
	}
}

// WithMemoryHeadroom raises the memory limit (and memory+swap with it, so
// still no swap) by bytes: room for a runtime's own processes that share
// the sandbox's memory cgroup. An error when the spec has no memory limit
// or bytes is negative.
func WithMemoryHeadroom(bytes int64) SpecOpts {
	return func(s *specs.Spec) error {
		m := s.Linux.Resources.Memory
		if m == nil || m.Limit == nil || bytes < 0 {
			return fmt.Errorf("memory headroom %d: the spec has no memory limit, or it is negative", bytes)
		}
		limit := *m.Limit + bytes
		m.Limit, m.Swap = &limit, &limit
		return nil
	}
}

// WithMounts appends mounts, in order, after the spec's own (the agent
// binary's among them).
func WithMounts(mounts ...specs.Mount) SpecOpts {
	return func(s *specs.Spec) error {
		for _, m := range mounts {
			if !filepath.IsAbs(m.Destination) {
				return fmt.Errorf("mount %s: the destination must be absolute", m.Destination)
			}
		}
		s.Mounts = append(append([]specs.Mount(nil), s.Mounts...), mounts...)
		return nil
	}
}

// WithEnv appends KEY=VALUE entries to the agent's environment.
func WithEnv(kv ...string) SpecOpts {
	return func(s *specs.Spec) error {
		s.Process.Env = append(s.Process.Env, kv...)
		return nil
	}
}

// WithRlimit appends a resource limit the runtime sets on the agent
// (kind as in the OCI spec, "RLIMIT_NPROC"; soft and hard values).
func WithRlimit(kind string, soft, hard uint64) SpecOpts {
	return func(s *specs.Spec) error {
		if soft > hard {
			return fmt.Errorf("rlimit %s: soft %d is above hard %d", kind, soft, hard)
		}
		s.Process.Rlimits = append(s.Process.Rlimits, specs.POSIXRlimit{Type: kind, Soft: soft, Hard: hard})
		return nil
	}
}

// WithAgentCapabilities adds caps to the agent's effective and permitted
// sets but not to its bounding set, so that no program it executes can
// have them (a runtime that hands the spec's sets to the first process as
// they are, such as gVisor's Sentry, keeps them for the agent alone).
func WithAgentCapabilities(caps ...string) SpecOpts {
	return func(s *specs.Spec) error {
		c := s.Process.Capabilities
		c.Effective = append(append([]string(nil), c.Effective...), caps...)
		c.Permitted = append(append([]string(nil), c.Permitted...), caps...)
		return nil
	}
}
