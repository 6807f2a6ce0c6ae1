package bench

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// msList converts milliseconds to durations.
func msList(vs ...float64) []time.Duration {
	out := make([]time.Duration, len(vs))
	for i, v := range vs {
		out[i] = time.Duration(v * float64(time.Millisecond))
	}
	return out
}

// TestPairedRatio checks the median of per-round ratios on series where
// it differs from the ratio of the medians: a load spike that hits both
// systems of a round moves neither's ratio.
func TestPairedRatio(t *testing.T) {
	for _, tc := range []struct {
		doc        string
		base, peer []time.Duration
		want       float64
		wantPairs  int
	}{
		{doc: "constant ratio survives a spike in both",
			base: msList(10, 10, 100, 10, 10), peer: msList(20, 20, 200, 20, 20), want: 2, wantPairs: 5},
		{doc: "odd count: the middle ratio",
			// ratios 3, 0.5, 2 -> median 2; the p50s (10 / 30) would give 3.
			base: msList(10, 40, 10), peer: msList(30, 20, 20), want: 2, wantPairs: 3},
		{doc: "even count: mean of the middle two",
			// ratios 1, 2, 4, 8 -> (2 + 4) / 2.
			base: msList(5, 5, 5, 5), peer: msList(5, 10, 20, 40), want: 3, wantPairs: 4},
		{doc: "forkbox slower: below 1",
			base: msList(80, 90, 100), peer: msList(40, 45, 50), want: 0.5, wantPairs: 3},
		{doc: "only the rounds both have",
			base: msList(10, 10, 10, 10), peer: msList(30, 10), want: 2, wantPairs: 2},
		{doc: "a zero base round is left out",
			base: msList(0, 10, 10), peer: msList(5, 30, 30), want: 3, wantPairs: 2},
		{doc: "no pair", base: nil, peer: msList(1), want: 0, wantPairs: 0},
	} {
		got, pairs := pairedRatio(tc.base, tc.peer)
		if math.Abs(got-tc.want) > 1e-9 || pairs != tc.wantPairs {
			t.Errorf("%s: pairedRatio = %v over %d pairs, want %v over %d", tc.doc, got, pairs, tc.want, tc.wantPairs)
		}
	}
}

// TestInterleave runs real steps (they sleep and record the order they
// ran in) and checks the rounds alternate, rotate which system goes
// first, skip warm-ups, pair round by round and go on without a system
// that failed.
func TestInterleave(t *testing.T) {
	var order []string
	fbRound, peerRound := 0, 0
	// forkbox takes 2 ms in even rounds and 6 in odd ones (a load that
	// moves); the peer takes three times as long in the same round.
	fb := contender{system: SystemForkbox, step: func(ctx context.Context) ([]time.Duration, error) {
		order = append(order, "fb")
		d := 2 * time.Millisecond
		if fbRound%2 == 1 {
			d = 6 * time.Millisecond
		}
		fbRound++
		time.Sleep(time.Millisecond)
		return []time.Duration{d, 2 * d}, nil
	}}
	peer := contender{system: SystemRunc, step: func(ctx context.Context) ([]time.Duration, error) {
		order = append(order, "runc")
		d := 6 * time.Millisecond
		if peerRound%2 == 1 {
			d = 18 * time.Millisecond
		}
		peerRound++
		return []time.Duration{d, d}, nil
	}}
	broken := 0
	failing := contender{system: SystemPodman, step: func(ctx context.Context) ([]time.Duration, error) {
		order = append(order, "podman")
		if broken++; broken == 3 {
			return nil, errors.New("podman fell over")
		}
		return []time.Duration{time.Millisecond, time.Millisecond}, nil
	}}
	rows := interleave(context.Background(), 1, 4, []string{OpPause, OpResume}, []contender{fb, peer, failing})

	// Podman fails in round 3 (iteration 2 after the warm-up): the last
	// two rounds run without it.
	want := "fb runc podman | runc podman fb | podman fb runc | fb runc | runc fb"
	var got []string
	i := 0
	for _, n := range []int{3, 3, 3, 2, 2} {
		if i+n > len(order) {
			break
		}
		got = append(got, strings.Join(order[i:i+n], " "))
		i += n
	}
	if i != len(order) {
		got = append(got, "extra: "+strings.Join(order[i:], " "))
	}
	if strings.Join(got, " | ") != want {
		t.Errorf("order = %q, want %q", strings.Join(got, " | "), want)
	}
	if len(rows) != 6 {
		t.Fatalf("%d rows, want 6", len(rows))
	}
	pause, resume := rows[0], rows[1]
	if pause.N != 4 || pause.System != SystemForkbox || pause.PairedRatio != nil {
		t.Errorf("forkbox pause = %+v, want 4 rounds (warm-up dropped) and no ratio", pause)
	}
	// Measured rounds are 1..4: forkbox 6, 2, 6, 2 ms.
	if pause.P50MS != 2 || pause.P99MS != 6 || resume.P50MS != 4 {
		t.Errorf("forkbox p50/p99 = %v/%v, resume p50 %v; want 2/6 and 4", pause.P50MS, pause.P99MS, resume.P50MS)
	}
	rp, rr := rows[2], rows[3]
	if rp.PairedRatio == nil || *rp.PairedRatio != 3 || rp.Pairs != 4 {
		t.Errorf("runc pause paired = %v over %d, want 3 over 4", rp.PairedRatio, rp.Pairs)
	}
	if rr.PairedRatio == nil || *rr.PairedRatio != 1.5 {
		t.Errorf("runc resume paired = %v, want 1.5", rr.PairedRatio)
	}
	if pp := rows[4]; pp.Error == "" || !strings.Contains(pp.Error, "iteration 2: podman fell over") || pp.PairedRatio != nil {
		t.Errorf("podman = %+v, want an error in iteration 2 and no ratio", pp)
	}
}

// TestInterleaveCancelled checks that a cancelled context ends the rounds
// and becomes the error of the systems still running.
func TestInterleaveCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	step := func(ctx context.Context) ([]time.Duration, error) {
		if calls++; calls == 3 {
			cancel()
		}
		return []time.Duration{time.Millisecond}, nil
	}
	rows := interleave(ctx, 0, 10, []string{OpExec}, []contender{{system: SystemForkbox, step: step}, {system: SystemRunc, step: step}})
	if calls != 3 {
		t.Errorf("%d steps ran, want 3 (none after the cancel)", calls)
	}
	for _, r := range rows {
		if !strings.Contains(r.Error, context.Canceled.Error()) {
			t.Errorf("%s: error %q, want the cancellation", r.System, r.Error)
		}
	}
}

// TestParseGroups checks the --only syntax.
func TestParseGroups(t *testing.T) {
	got, err := ParseGroups("exec, fork,exec")
	if err != nil || strings.Join(got, ",") != "exec,fork" {
		t.Errorf("ParseGroups(exec, fork,exec) = %v, %v; want exec,fork in run order", got, err)
	}
	if got, _ := ParseGroups("all"); len(got) != len(Groups) {
		t.Errorf("all = %v, want every group", got)
	}
	if got, _ := ParseGroups(""); strings.Join(got, ",") != strings.Join(DefaultGroups, ",") {
		t.Errorf("empty = %v, want the default groups", got)
	}
	if _, err := ParseGroups("exec,forks"); err == nil || !strings.Contains(err.Error(), `"forks"`) {
		t.Errorf("unknown group: err = %v, want one naming it", err)
	}
}
