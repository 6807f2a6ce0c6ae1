package monitor

import (
	"testing"
	"time"

	"github.com/forkbox/forkbox/node"
)

// TestHistoryKeepsTheLastSamplesInRange proves a session's samples are
// kept oldest first, bounded (the oldest dropped), selected by time, and
// forgotten with the session.
func TestHistoryKeepsTheLastSamplesInRange(t *testing.T) {
	mon := New(Options{})
	t0 := time.Unix(1000, 0).UTC()
	for i := 0; i < historySamples+10; i++ {
		mon.history.add("a", node.UsageSample{Time: t0.Add(time.Duration(i) * time.Second), CPUSeconds: float64(i)})
	}
	mon.history.add("b", node.UsageSample{Time: t0})
	all := mon.UsageHistory("a", time.Time{}, time.Time{})
	if len(all) != historySamples || all[0].CPUSeconds != 10 || all[len(all)-1].CPUSeconds != historySamples+9 {
		t.Fatalf("kept %d, first %v, last %v", len(all), all[0], all[len(all)-1])
	}
	for i := 1; i < len(all); i++ {
		if !all[i].Time.After(all[i-1].Time) {
			t.Fatalf("not oldest first at %d", i)
		}
	}
	some := mon.UsageHistory("a", t0.Add(100*time.Second), t0.Add(102*time.Second))
	if len(some) != 3 || some[0].CPUSeconds != 100 {
		t.Fatalf("in range: %v", some)
	}
	mon.ForgetHistory("a")
	if n := len(mon.UsageHistory("a", time.Time{}, time.Time{})); n != 0 {
		t.Fatalf("%d samples after forgetting", n)
	}
	if n := len(mon.UsageHistory("b", time.Time{}, time.Time{})); n != 1 {
		t.Fatalf("another session's samples: %d", n)
	}
}
