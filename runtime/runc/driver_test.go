package runc_test

import (
	"os/exec"
	"testing"

	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/runtime/cgroupv1"
	"github.com/forkbox/forkbox/runtime/drivertest"
	"github.com/forkbox/forkbox/runtime/runc"
)

// TestConformance runs the driver conformance suite against runc.
func TestConformance(t *testing.T) {
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("runc is not installed (make deps installs it)")
	}
	// The suite's sandboxes are gone by then: their parent goes too.
	t.Cleanup(func() { _ = cgroupv1.New("forkbox-drivertest").RemoveParent() })
	drivertest.Run(t, func(t *testing.T, stateRoot string) runtime.Driver {
		d, err := runc.New(runc.Options{StateRoot: stateRoot, CgroupParent: "forkbox-drivertest"})
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
}
