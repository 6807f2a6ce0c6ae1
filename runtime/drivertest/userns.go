package drivertest

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/userns"
)

// testJoinUserNamespace: a sandbox joins a user namespace the host made
// (owned by a slice of host ids) over an id-mapped root filesystem: it
// runs as the slice's ids, its files land on disk with the storage ids,
// and the resource limits the runtime cannot set from outside are in
// force.
func (e *env) testJoinUserNamespace(t *testing.T) {
	claims, err := userns.OpenClaims(userns.DefaultClaimsDir, userns.DefaultRange, "drivertest:"+e.dir)
	if err != nil {
		t.Fatal(err)
	}
	slice, err := claims.Claim("dt")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { claims.Release("dt") })
	shift := storage.DefaultIDShift
	var home string
	sb := e.startWith(t, defaultLimits, func(cfg *runtime.Config) {
		mapped := filepath.Join(cfg.StateDir, "rootfs")
		if err := os.Mkdir(mapped, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := userns.MapMount(cfg.RootFS, mapped, shift.UIDBase, slice.First, shift.Size); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { userns.RemoveFile(mapped) })
		home = filepath.Join(cfg.RootFS, "home/user")
		for i := range cfg.Mounts {
			if strings.HasPrefix(cfg.Mounts[i].Source, cfg.RootFS+"/") {
				cfg.Mounts[i].Source = filepath.Join(mapped, strings.TrimPrefix(cfg.Mounts[i].Source, cfg.RootFS))
			}
		}
		nsPath := filepath.Join(cfg.StateDir, "userns")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := userns.Create(ctx, userns.NamespaceOptions{Owner: slice,
			Map: userns.Mapping{HostID: slice.First, Size: userns.SliceSize}, UserPath: nsPath}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { userns.RemoveFile(nsPath) })
		cfg.RootFS, cfg.UserNamespace = mapped, nsPath
		cfg.UIDMap = []runtime.IDMap{{ContainerID: 0, HostID: slice.First, Size: userns.SliceSize}}
		cfg.GIDMap = cfg.UIDMap
		cfg.Rlimits = runtime.Rlimits{{Resource: "RLIMIT_NOFILE", Soft: 1234, Hard: 1234}, {Resource: "RLIMIT_CORE"}}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, out, _ := sb.run(t, ctx, "/bin/sh", "-c", "cat /proc/self/uid_map; ulimit -n; ulimit -c; touch /home/user/made")
	f := strings.Fields(out)
	if len(f) != 5 || f[1] != strconv.FormatUint(uint64(slice.First), 10) || f[3] != "1234" || f[4] != "0" {
		t.Fatalf("uid_map, open files, core limit = %q; want the slice %d, 1234 and 0", out, slice.First)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(home, "made"), &st); err != nil {
		t.Fatal(err)
	}
	if st.Uid != uint32(shift.UID(1000)) {
		t.Fatalf("a file the sandbox's user made is owned on disk by %d, want the storage id %d", st.Uid, shift.UID(1000))
	}
}
