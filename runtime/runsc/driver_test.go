package runsc_test

import (
	"os"
	"os/exec"
	"testing"

	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/runtime/cgroupv1"
	"github.com/forkbox/forkbox/runtime/drivertest"
	"github.com/forkbox/forkbox/runtime/runsc"
)

// TestConformance runs the driver conformance suite against gVisor (the
// runsc New picks: the pinned build when installed), and checks that no
// mount of runsc's is left in a state root once its sandboxes are deleted.
func TestConformance(t *testing.T) {
	if _, err := exec.LookPath("runsc"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("runsc is not installed; CI must run the gVisor conformance suite (make deps installs it)")
		}
		t.Skip("runsc is not installed (Debian bookworm-backports; make deps installs it)")
	}
	// The suite's sandboxes are gone by then: their parent goes too.
	t.Cleanup(func() { _ = cgroupv1.New("forkbox-drivertest").RemoveParent() })
	drivertest.Run(t, func(t *testing.T, stateRoot string) runtime.Driver {
		d, err := runsc.New(runsc.Options{StateRoot: stateRoot, CgroupParent: "forkbox-drivertest"})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("runsc %s (%s)", d.Version(), d.Binary())
		// Runs before the suite's own clean-up removes the root, after the
		// sandboxes are deleted.
		t.Cleanup(func() {
			if m := mountsUnder(t, stateRoot); len(m) > 0 {
				t.Errorf("mounts left in the state root after every sandbox was deleted: %v", m)
			}
		})
		return d
	})
}
