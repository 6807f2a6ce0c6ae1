package ocispec

import specs "github.com/opencontainers/runtime-spec/specs-go"

// Blocked ioctl requests (linux/btrfs.h, linux/fs.h):
//   - btrfs subvolume and snapshot creation: BTRFS_IOC_SNAP_CREATE
//     0x50009401, SUBVOL_CREATE 0x5000940e and their _V2 forms 0x50009417
//     and 0x50009418. Any user may create a subvolume in a directory it
//     can write, and a subvolume nested in a sandbox's layer falls outside
//     the layer's quota group: it would escape the disk limit and be
//     missing from snapshots.
//   - reflinks and deduplication: FICLONE 0x40049409, FICLONERANGE
//     0x4020940d, FIDEDUPERANGE 0xc0189436 (btrfs's CLONE, CLONE_RANGE
//     and FILE_EXTENT_SAME are the same numbers). The disk limits of a
//     layer and of a volume count exclusive bytes: data one shares with
//     the other, or with the template, by reflink counts against neither,
//     so a sandbox with a volume could write past both. Copy tools fall
//     back to plain copies.
var blockedIoctls = []uint64{0x50009401, 0x5000940e, 0x50009417, 0x50009418, 0x40049409, 0x4020940d, 0xc0189436}

// copy_file_range reflinks within one filesystem (the kernel tries the
// filesystem's remap first), so it is refused as not implemented
// (ENOSYS, 38), on which every copy tool falls back to read and write.
const copyFileRangeErrno = 38

// restrictIoctl rewrites profile so that ioctl is allowed except for the
// blocked requests, which fail with the profile's default action (EPERM),
// and refuses copy_file_range (ENOSYS).
//
// libseccomp lets an unconditional allow of ioctl win over any conditional
// denial, so the profile's ioctl allow is replaced by rules that allow
// exactly the complement of blockedIoctls, compared on the request's low
// 32 bits (the kernel reads the request as an unsigned int, so high bits
// must not slip past): walking each blocked value's bits from the top,
// the requests that agree with it above a bit and differ at that bit are
// allowed unless another blocked value is among them (complementRules).
func restrictIoctl(profile *specs.LinuxSeccomp) {
	for i := range profile.Syscalls {
		sc := &profile.Syscalls[i]
		if sc.Action != specs.ActAllow || len(sc.Args) > 0 {
			continue
		}
		names := sc.Names[:0]
		for _, n := range sc.Names {
			if n != "ioctl" && n != "copy_file_range" {
				names = append(names, n)
			}
		}
		sc.Names = names
	}
	for _, r := range complementRules(blockedIoctls) {
		profile.Syscalls = append(profile.Syscalls, specs.LinuxSyscall{
			Names: []string{"ioctl"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 1, Value: r[0], ValueTwo: r[1], Op: specs.OpMaskedEqual}},
		})
	}
	errno := uint(copyFileRangeErrno)
	profile.Syscalls = append(profile.Syscalls, specs.LinuxSyscall{
		Names: []string{"copy_file_range"}, Action: specs.ActErrno, ErrnoRet: &errno})
}

// complementRules returns (mask, value) pairs whose matches (v&mask ==
// value) are exactly the 32-bit values not in blocked: for each blocked
// value b and bit i, the set agreeing with b above i and differing at i,
// when no blocked value lies in it (each such set is listed once).
func complementRules(blocked []uint64) [][2]uint64 {
	var out [][2]uint64
	seen := map[[2]uint64]bool{}
	for _, b := range blocked {
		for i := 31; i >= 0; i-- {
			mask := uint64(0xffffffff) &^ (uint64(1)<<i - 1) // bits 31..i
			value := (b ^ uint64(1)<<i) & mask
			hit := false
			for _, o := range blocked {
				hit = hit || o&mask == value
			}
			r := [2]uint64{mask, value}
			if !hit && !seen[r] {
				seen[r] = true
				out = append(out, r)
			}
		}
	}
	return out
}

// nativeSeccompArch is the seccomp architecture of each GOARCH forkbox runs on.
var nativeSeccompArch = map[string]specs.Arch{
	"amd64": specs.ArchX86_64,
	"arm64": specs.ArchAARCH64,
}
