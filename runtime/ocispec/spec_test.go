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
// creation and reflinks, even with high bits set to dodge a 64-bit
// comparison.
func TestIoctlRules(t *testing.T) {
	s, err := Build(runtime.Config{ID: "x", Limits: runtime.Limits{CPU: 1, MemoryBytes: 1 << 30, Pids: 64},
		AgentPath: "/agent", RootFS: "/rootfs"})
	if err != nil {
		t.Fatal(err)
	}
	p := s.Linux.Seccomp
	for _, req := range []uint64{0x5413, 0x541b, 0x80086601, 0xffffffff80086601, 0x40049408, 0x50009400, 0x5000941f, 0xc0189437, 0x4020940c} {
		if !allowsIoctl(p, req) {
			t.Errorf("ioctl %#x is refused", req)
		}
	}
	for _, req := range []uint64{0x50009401, 0x5000940e, 0x50009417, 0x50009418, 0xffffffff5000940e, 0xa5a550009418,
		0x40049409, 0x4020940d, 0xc0189436, 0xffffffff40049409} {
		if allowsIoctl(p, req) {
			t.Errorf("ioctl %#x (btrfs subvolume creation or a reflink) is allowed", req)
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

// TestComplementRules checks the ioctl allow rules exhaustively around
// every blocked value and on a sweep of the 32-bit space: a value is
// matched exactly when it is not blocked.
func TestComplementRules(t *testing.T) {
	rules := complementRules(blockedIoctls)
	matched := func(v uint64) bool {
		for _, r := range rules {
			if v&r[0] == r[1] {
				return true
			}
		}
		return false
	}
	blocked := map[uint64]bool{}
	for _, b := range blockedIoctls {
		blocked[b] = true
	}
	check := func(v uint64) {
		if matched(v) == blocked[v] {
			t.Fatalf("%#x: matched %v, blocked %v", v, matched(v), blocked[v])
		}
	}
	for _, b := range blockedIoctls {
		for d := uint64(0); d < 4096; d++ {
			check((b + d - 2048) & 0xffffffff)
		}
		for i := 0; i < 32; i++ {
			check(b ^ 1<<i)
		}
	}
	for v := uint64(0); v < 1<<32; v += 65537 {
		check(v)
	}
	t.Logf("%d rules", len(rules))
}
