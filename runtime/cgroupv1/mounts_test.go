package cgroupv1

import "testing"

// TestParseCgroupMounts: every v1 controller maps to its hierarchy, and the
// unified (cgroup2) hierarchy of a hybrid host is found too, so that
// remove deletes a sandbox's directory there as well.
func TestParseCgroupMounts(t *testing.T) {
	mountinfo := `25 30 0:23 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
32 31 0:27 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
33 31 0:28 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
36 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:14 - cgroup cgroup rw,cpu,cpuacct
37 31 0:32 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:15 - cgroup cgroup rw,pids
`
	got, err := parseCgroupMounts([]byte(mountinfo))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"cpu": "/sys/fs/cgroup/cpu,cpuacct", "cpuacct": "/sys/fs/cgroup/cpu,cpuacct",
		"pids": "/sys/fs/cgroup/pids", "name=systemd": "/sys/fs/cgroup/systemd",
		unifiedKey: "/sys/fs/cgroup/unified",
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	if _, err := parseCgroupMounts([]byte("32 31 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")); err == nil {
		t.Error("a host without cgroup v1 was accepted")
	}
}
