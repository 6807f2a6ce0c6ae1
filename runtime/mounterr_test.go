package runtime

import (
	"errors"
	"testing"
)

// TestAsMountError proves the mount failures of runc and runsc (as they
// appear in a driver's error, escaped quotes included) become MountErrors
// naming the sandbox path, and other errors pass unchanged.
func TestAsMountError(t *testing.T) {
	for msg, target := range map[string]string{
		`runc run x: internal error: exit status 1: time="t" level=error msg="runc run failed: unable to start container process: error during container init: error mounting \"/data/sandboxes/x/hosts\" to rootfs at \"/etc/hosts\": \"/data/layers/x/proc/1/environ\" cannot be mounted because it is inside /proc"`: "/etc/hosts",
		`error mounting "/data/sandboxes/x/hostname" to rootfs at "/etc/hostname": mount /proc/self/fd/11:/etc/hostname (via /proc/self/fd/14), flags: 0x1007: not a directory`:                                                                                                                                         "/etc/hostname",
		`runsc run x: internal error: exit status 128: starting sandbox: failed to setupFS: mounting submounts: mount submount "/proc/self/hosts": creating mount point "/proc/self/hosts": not a directory`:                                                                                                            "/proc/self/hosts",
		`runc run x: internal error: exit status 1: permission denied`: "",
	} {
		orig := errors.New(msg)
		err := AsMountError(orig)
		var me *MountError
		switch {
		case target == "" && err != orig:
			t.Errorf("%.60s: %v, want it unchanged", msg, err)
		case target != "" && (!errors.As(err, &me) || me.Target != target || !errors.Is(err, orig)):
			t.Errorf("%.60s: %v, want a mount error for %s", msg, err, target)
		}
	}
	if AsMountError(nil) != nil {
		t.Error("nil is not nil")
	}
}
