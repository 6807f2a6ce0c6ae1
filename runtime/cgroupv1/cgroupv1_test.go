package cgroupv1

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// TestLifecycle drives the exported operations against real cgroup v1
// hierarchies and a real process: a sandbox cgroup made the way runc
// makes one (PARENT/ID in each hierarchy) is listed, read, frozen,
// thawed, killed and removed, and its parent goes last. Needs root.
func TestLifecycle(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (makes cgroups)")
	}
	parent := fmt.Sprintf("forkbox-cgtest%d", time.Now().UnixNano()%1e9)
	c := New(parent)
	id := "cg" + strconv.Itoa(os.Getpid())
	controllers := []string{"cpuacct", "memory", "pids", "freezer"}
	var dirs []string
	for _, ctl := range controllers {
		mp, err := c.mountPoint(ctl)
		if err != nil {
			t.Skipf("no cgroup v1 %s hierarchy: %v", ctl, err)
		}
		dir := filepath.Join(mp, parent, id)
		if slices.Contains(dirs, dir) {
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		dirs = append(dirs, dir, filepath.Dir(dir))
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = c.Kill(ctx, id) // a test that failed half-way leaves no process
		for _, d := range dirs {
			_ = os.Remove(d)
		}
	})
	if _, err := c.Stats("../" + id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Stats of a path: %v, want not found", err)
	}
	if _, err := c.Procs("../x"); err == nil {
		t.Fatal("Procs accepted a path as an id")
	}
	ids, err := c.Sandboxes()
	if err != nil || !slices.Equal(ids, []string{id}) {
		t.Fatalf("Sandboxes = %v %v, want [%s]", ids, err, id)
	}

	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	pid := strconv.Itoa(cmd.Process.Pid)
	for _, d := range dirs {
		if filepath.Base(d) == id {
			if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(pid), 0); err != nil {
				_ = cmd.Process.Kill()
				t.Fatal(err)
			}
		}
	}
	procs, err := c.Procs(id)
	if err != nil || !slices.Equal(procs, []int{cmd.Process.Pid}) {
		t.Fatalf("Procs = %v %v, want [%d]", procs, err, cmd.Process.Pid)
	}
	st, err := c.Stats(id)
	if err != nil || st.Pids != 1 || st.MemoryBytes < 0 || st.ReadAt.IsZero() {
		t.Fatalf("Stats = %+v %v, want one task", st, err)
	}
	if st, err := c.Sample(id); err != nil || st.Pids != 1 || st.PidsLimit != 0 {
		t.Fatalf("Sample = %+v %v, want one task and no pids limit", st, err)
	}

	if err := c.SetFreezer(id, Frozen); err != nil {
		t.Fatal(err)
	}
	if s, err := c.FreezerState(id); err != nil || s != Frozen {
		t.Fatalf("FreezerState = %q %v, want FROZEN", s, err)
	}
	// Kill thaws a frozen cgroup so that SIGKILL is delivered.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Kill(ctx, id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the process survived Kill")
	}
	if s, err := c.FreezerState(id); err != nil || s != Thawed {
		t.Fatalf("FreezerState after Kill = %q %v, want THAWED", s, err)
	}
	if err := c.Remove(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Stats(id); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Stats after Remove: %v, want not found", err)
	}
	if _, err := c.Procs(id); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Procs after Remove: %v, want not exist", err)
	}
	if err := c.Kill(ctx, id); err != nil {
		t.Fatalf("Kill of a removed sandbox: %v", err)
	}
	if err := c.RemoveParent(); err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is left: %v", d, err)
		}
	}
}
