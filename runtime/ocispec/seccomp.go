package ocispec

import specs "github.com/opencontainers/runtime-spec/specs-go"

// Blocked ioctl requests: btrfs subvolume and snapshot creation
// (BTRFS_IOC_SNAP_CREATE 0x50009401, SUBVOL_CREATE 0x5000940e, and their
// _V2 forms 0x50009417 and 0x50009418, linux/btrfs.h). Any user may create
// a subvolume in a directory it can write, and a subvolume nested in a
// sandbox's layer falls outside the layer's quota group: it would escape
// the disk limit and be missing from snapshots.
//
// libseccomp lets an unconditional allow of ioctl win over any conditional
// denial, so the profile's ioctl allow is replaced by rules that allow
// exactly the complement: every request whose low 32 bits (the kernel reads
// the request as an unsigned int, so high bits must not slip past) differ
// from blockedIoctlBase in one of the bits of blockedIoctlMask, plus every
// request under that prefix except the blocked low bits.
const (
	blockedIoctlBase = 0x50009400
	blockedIoctlMask = 0xffffffe0 // the prefix bits; the low 5 bits vary
)

var blockedIoctlLow = map[uint64]bool{0x01: true, 0x0e: true, 0x17: true, 0x18: true}

// restrictIoctl rewrites profile so that ioctl is allowed except for the
// blocked requests, which fail with the profile's default action (EPERM).
func restrictIoctl(profile *specs.LinuxSeccomp) {
	for i := range profile.Syscalls {
		sc := &profile.Syscalls[i]
		if sc.Action != specs.ActAllow || len(sc.Args) > 0 {
			continue
		}
		names := sc.Names[:0]
		for _, n := range sc.Names {
			if n != "ioctl" {
				names = append(names, n)
			}
		}
		sc.Names = names
	}
	allow := func(mask, value uint64) {
		profile.Syscalls = append(profile.Syscalls, specs.LinuxSyscall{
			Names: []string{"ioctl"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 1, Value: mask, ValueTwo: value, Op: specs.OpMaskedEqual}},
		})
	}
	for bit := uint64(1); bit <= 1<<31; bit <<= 1 {
		if blockedIoctlMask&bit != 0 {
			allow(bit, ^uint64(blockedIoctlBase)&bit) // differs in this prefix bit
		}
	}
	for low := uint64(0); low <= ^uint64(blockedIoctlMask)&0xffffffff; low++ {
		if !blockedIoctlLow[low] {
			allow(0xffffffff, blockedIoctlBase|low)
		}
	}
}

// nativeSeccompArch is the seccomp architecture of each GOARCH forkbox runs on.
var nativeSeccompArch = map[string]specs.Arch{
	"amd64": specs.ArchX86_64,
	"arm64": specs.ArchAARCH64,
}
