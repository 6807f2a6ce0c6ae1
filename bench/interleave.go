package bench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"
)

// On a shared machine the load moves while a benchmark runs: a series of
// forkbox iterations timed before a series of peer iterations can see a
// different machine. So every row with a peer is measured in rounds: each
// round runs one iteration of every system, back to back, and the ratio of
// a peer to forkbox is taken within each round (a load spike slows both of
// a pair) and summarised by its median.

// contender is one system's part in an interleaved group of operations.
type contender struct {
	// system is one of the System constants.
	system string
	// step runs one iteration and returns one duration per operation of
	// the group (in the group's order). It may do untimed setup and
	// cleanup around the parts it times.
	step func(ctx context.Context) ([]time.Duration, error)
}

// interleave measures ops on every contender in warmup+n rounds. Round i
// runs each contender's step once, starting with contender i mod
// len(cs) and going round, so that no system always runs right after the
// same one; the first warmup rounds are not counted. A contender whose
// step fails is left out of later rounds and its rows carry the error;
// the others go on. It returns one row per contender and operation, in
// the order of cs then ops; the rows of every contender after the first
// carry the paired ratio to the first (forkbox) over the measured rounds
// both completed. A cancelled ctx ends the rounds and is every
// unfinished contender's error.
func interleave(ctx context.Context, warmup, n int, ops []string, cs []contender) []Result {
	samples := make([][][]time.Duration, len(cs)) // [contender][op][round]
	errs := make([]error, len(cs))
	for c := range cs {
		samples[c] = make([][]time.Duration, len(ops))
	}
	for round := 0; round < warmup+n; round++ {
		for k := range cs {
			c := (round + k) % len(cs)
			if errs[c] != nil {
				continue
			}
			if err := ctx.Err(); err != nil {
				errs[c] = err
				continue
			}
			ds, err := cs[c].step(ctx)
			if err == nil && len(ds) != len(ops) {
				err = fmt.Errorf("%d durations for %d operations", len(ds), len(ops))
			}
			if err != nil {
				if round < warmup {
					errs[c] = fmt.Errorf("warm-up %d: %w", round+1, err)
				} else {
					errs[c] = fmt.Errorf("iteration %d: %w", round-warmup+1, err)
				}
				continue
			}
			if round >= warmup {
				for o, d := range ds {
					samples[c][o] = append(samples[c][o], d)
				}
			}
		}
	}
	var rows []Result
	for c := range cs {
		for o, op := range ops {
			r := newResult(op, cs[c].system, samples[c][o], errs[c])
			if c > 0 && errs[c] == nil && errs[0] == nil {
				r.setPaired(samples[0][o], samples[c][o])
			}
			rows = append(rows, r)
		}
	}
	return rows
}

// setPaired sets r's paired ratio to forkbox from the two series of one
// interleaved measurement (base: forkbox's, round by round).
func (r *Result) setPaired(base, peer []time.Duration) {
	ratio, pairs := pairedRatio(base, peer)
	if pairs == 0 {
		return
	}
	ratio = round2(ratio)
	r.PairedRatio, r.Pairs = &ratio, pairs
}

// pairedRatio returns the median over rounds i of peer[i] / base[i] and
// how many pairs it was taken over (the rounds both series have: the
// shorter length; rounds whose base is not positive are left out). With
// an even number of pairs the median is the mean of the middle two. It
// returns (0, 0) when there is no pair. Above 1: forkbox (base) took
// less time in the typical round.
func pairedRatio(base, peer []time.Duration) (float64, int) {
	ratios := make([]float64, 0, min(len(base), len(peer)))
	for i := 0; i < len(base) && i < len(peer); i++ {
		if base[i] > 0 {
			ratios = append(ratios, float64(peer[i])/float64(base[i]))
		}
	}
	if len(ratios) == 0 {
		return 0, 0
	}
	return median(ratios), len(ratios)
}

// median returns the median of xs (not empty): the middle value, or the
// mean of the middle two for an even count. xs is not changed.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// perOp converts a throughput window (ops operations completed in d) to
// the time one operation took on average, the quantity interleave pairs;
// 0 ops gives an infinitely long operation.
func perOp(d time.Duration, ops int) time.Duration {
	if ops <= 0 {
		return time.Duration(math.MaxInt64)
	}
	return d / time.Duration(ops)
}
