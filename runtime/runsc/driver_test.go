package runsc_test

import (
	"os/exec"
	"testing"

	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/runtime/drivertest"
	"github.com/forkbox/forkbox/runtime/runsc"
)

// TestConformance runs the driver conformance suite against gVisor.
func TestConformance(t *testing.T) {
	if _, err := exec.LookPath("runsc"); err != nil {
		t.Skip("runsc is not installed (Debian bookworm-backports)")
	}
	drivertest.Run(t, func(t *testing.T, stateRoot string) runtime.Driver {
		d, err := runsc.New(runsc.Options{StateRoot: stateRoot})
		if err != nil {
			t.Fatal(err)
		}
		return d
	})
}
