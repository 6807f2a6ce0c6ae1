package cgroupv1

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// TestCgroupsAdoptLegacySandbox: a daemon whose sandboxes live under a
// parent of its own still reads, kills and removes the cgroups of a
// sandbox a previous version made under LegacyParent, and leaves
// another parent's sandbox of the same id alone. Real cgroup v1
// hierarchies: needs root.
func TestCgroupsAdoptLegacySandbox(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (makes cgroups)")
	}
	probe := &Cgroups{}
	if _, err := probe.mountPoint("pids"); err != nil {
		t.Skipf("no cgroup v1 pids hierarchy: %v", err)
	}
	id := fmt.Sprintf("legacytest%d", time.Now().UnixNano()%1e9)
	own := New("forkbox-unittest-own")
	other := New("forkbox-unittest-other")
	var made []string
	mk := func(parent string) {
		for _, controller := range []string{"cpuacct", "pids"} {
			mp, _ := probe.mountPoint(controller)
			dir := filepath.Join(mp, parent, id)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			made = append(made, dir)
			if parent != LegacyParent { // other daemons' sandboxes may be there
				made = append(made, filepath.Dir(dir))
			}
		}
	}
	t.Cleanup(func() {
		for _, d := range made {
			_ = os.Remove(d)
		}
	})
	mk(LegacyParent)
	mk("forkbox-unittest-other")
	mp, _ := probe.mountPoint("pids")
	if err := os.WriteFile(filepath.Join(mp, LegacyParent, id, "pids.max"), []byte("77"), 0); err != nil {
		t.Fatal(err)
	}
	st, err := own.Sample(id)
	if err != nil || st.PidsLimit != 77 {
		t.Fatalf("sample of the legacy sandbox: %+v %v, want its pids.max 77", st, err)
	}
	if got := own.SpecPath(id); got != "/forkbox-unittest-own/"+id {
		t.Fatalf("SpecPath = %q", got)
	}
	if err := own.Remove(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mp, LegacyParent, id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the legacy cgroup is left: %v", err)
	}
	if _, err := os.Stat(filepath.Join(mp, "forkbox-unittest-other", id)); err != nil {
		t.Fatalf("another parent's cgroup was touched: %v", err)
	}
	if _, err := own.Sample(id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("sample after remove: %v, want not found", err)
	}
	if _, err := other.Sample(id); err != nil {
		t.Fatalf("the other parent's sandbox: %v", err)
	}
	if err := other.Remove(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if err := other.RemoveParent(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(mp, "forkbox-unittest-other")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("empty parent left after RemoveParent: %v", err)
	}
}
