package sandbox

import (
	"testing"
	"time"
)

// TestScaledWait proves the readiness wait grows with the driver's
// start-up scale and with the host's load per CPU above 1, never drops
// below the base and stops at maxReadyWait.
func TestScaledWait(t *testing.T) {
	for _, c := range []struct {
		base        time.Duration
		scale, load float64
		cpus        int
		want        time.Duration
	}{
		{10 * time.Second, 1, 0.5, 2, 10 * time.Second}, // idle host, runc
		{10 * time.Second, 1, 2, 2, 10 * time.Second},   // load = CPUs: no scaling
		{10 * time.Second, 3, 1, 2, 30 * time.Second},   // gVisor
		{10 * time.Second, 1, 6, 2, 30 * time.Second},   // load 3 per CPU
		{10 * time.Second, 3, 14, 2, maxReadyWait},      // the host: load 14 on 2 CPUs
		{10 * time.Second, 0, 0, 0, 10 * time.Second},   // nothing known
		{2 * time.Minute, 1, 0, 2, 2 * time.Minute},     // a base above the bound stays
	} {
		if got := scaledWait(c.base, c.scale, c.load, c.cpus); got != c.want {
			t.Errorf("scaledWait(%s, %g, %g, %d) = %s, want %s", c.base, c.scale, c.load, c.cpus, got, c.want)
		}
	}
	if l, err := loadAverage(); err != nil || l < 0 {
		t.Fatalf("load average %g %v", l, err)
	}
}
