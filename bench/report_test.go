package bench

import "testing"

// TestFinishKeepsUnlistedOperationsTogether: rows of operations opOrder
// does not name end up after the named ones, each operation's rows next
// to each other (forkbox first), in the order they were measured, so the
// table prints each of them once.
func TestFinishKeepsUnlistedOperationsTogether(t *testing.T) {
	r := &Report{Results: []Result{
		{Operation: OpPortRequest, System: SystemForkbox},
		{Operation: OpEgressRunc, System: SystemForkbox},
		{Operation: OpPortRequest, System: "same server on the host"},
		{Operation: OpExec, System: SystemRunc},
		{Operation: OpEgressRunc, System: "host process, direct"},
		{Operation: OpExec, System: SystemForkbox},
	}}
	r.finish()
	want := []string{OpExec, OpExec, OpPortRequest, OpPortRequest, OpEgressRunc, OpEgressRunc}
	for i, res := range r.Results {
		if res.Operation != want[i] {
			t.Fatalf("row %d is %q, want %q (rows %+v)", i, res.Operation, want[i], r.Results)
		}
	}
	if r.Results[0].System != SystemForkbox || r.Results[2].System != SystemForkbox {
		t.Errorf("forkbox's row is not first within its operation: %+v", r.Results)
	}
	if got := len(r.operations()); got != 3 {
		t.Errorf("operations() = %d, want 3", got)
	}
}
