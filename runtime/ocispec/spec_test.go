package ocispec

import (
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/runtime"
)

// allowsIoctl evaluates the profile's ioctl rules for request the way the
// kernel filter does: allowed when an allow rule matches.
func allowsIoctl(p *specs.LinuxSeccomp, request uint64) bool {
	for _, sc := range p.Syscalls {
		if sc.Action != specs.ActAllow {
			continue
		}
		for _, n := range sc.Names {
			if n != "ioctl" {
				continue
			}
			if len(sc.Args) == 0 {
				return true
			}
			a := sc.Args[0]
			if a.Index == 1 && a.Op == specs.OpMaskedEqual && request&a.Value == a.ValueTwo {
				return true
			}
		}
	}
	return false
}

// TestIoctlRules proves the profile allows ordinary ioctls (also with
// sign-extended requests) and refuses btrfs subvolume and snapshot
// creation, even with high bits set to dodge a 64-bit comparison.
func TestIoctlRules(t *testing.T) {
	s, err := Build(runtime.Config{ID: "x", Limits: runtime.Limits{CPU: 1, MemoryBytes: 1 << 30, Pids: 64},
		AgentPath: "/agent", RootFS: "/rootfs"})
	if err != nil {
		t.Fatal(err)
	}
	p := s.Linux.Seccomp
	for _, req := range []uint64{0x5413, 0x541b, 0x80086601, 0xffffffff80086601, 0x40049409, 0x50009400, 0x5000941f, 0xc0189436} {
		if !allowsIoctl(p, req) {
			t.Errorf("ioctl %#x is refused", req)
		}
	}
	for _, req := range []uint64{0x50009401, 0x5000940e, 0x50009417, 0x50009418, 0xffffffff5000940e, 0xa5a550009418} {
		if allowsIoctl(p, req) {
			t.Errorf("ioctl %#x (btrfs subvolume creation) is allowed", req)
		}
	}
}

// TestSpecPinsAgentOOMScore proves the spec sets the agent's
// oom_score_adj to AgentOOMScoreAdj (0) rather than leaving the daemon's
// own score to be inherited, since that score is also the lowest any
// process of the sandbox may give itself.
func TestSpecPinsAgentOOMScore(t *testing.T) {
	s, err := Build(runtime.Config{ID: "x", RootFS: "/r", Limits: runtime.Limits{CPU: 1, MemoryBytes: 1 << 28, Pids: 10}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Process.OOMScoreAdj == nil || *s.Process.OOMScoreAdj != AgentOOMScoreAdj || AgentOOMScoreAdj != 0 {
		t.Fatalf("process.oomScoreAdj = %v, want 0", s.Process.OOMScoreAdj)
	}
}
