package bench

import (
	"bytes"
	"runtime/pprof"
	"strings"

	"github.com/google/pprof/profile"
)

// cpuSplit is where a process's CPU went while a CPU profile ran: the
// share of its samples with a frame of the embedded NATS server
// (github.com/nats-io/nats-server), of the garbage collector's workers
// (runtime.gcBgMarkWorker, which serve the server and the clients
// alike), and the rest (the NATS client, JSON, the simulated hosts).
type cpuSplit struct {
	// Server, GC and Other are fractions of the sampled CPU time (they
	// add up to 1).
	Server, GC, Other float64
	// Seconds is the CPU time the profile sampled.
	Seconds float64
}

// cpuProfile is a CPU profile being taken (nil when another one was
// already running in the process).
type cpuProfile struct{ buf *bytes.Buffer }

// startCPUProfile starts Go's CPU profiler for this process; a process
// already profiling gets a profile that stops to nil.
func startCPUProfile() *cpuProfile {
	buf := &bytes.Buffer{}
	if err := pprof.StartCPUProfile(buf); err != nil {
		return &cpuProfile{}
	}
	return &cpuProfile{buf: buf}
}

// stop stops the profiler and splits its samples; nil when there was
// no profile or it cannot be read.
func (p *cpuProfile) stop() *cpuSplit {
	if p.buf == nil {
		return nil
	}
	pprof.StopCPUProfile()
	prof, err := profile.Parse(p.buf)
	if err != nil || len(prof.SampleType) < 2 {
		return nil
	}
	// Sample values: [samples count, cpu nanoseconds].
	var server, gc, total int64
	for _, s := range prof.Sample {
		ns := s.Value[1]
		total += ns
		switch {
		case stackHas(s, "github.com/nats-io/nats-server/"):
			server += ns
		case stackHas(s, "runtime.gcBgMarkWorker"):
			gc += ns
		}
	}
	if total == 0 {
		return nil
	}
	t := float64(total)
	return &cpuSplit{Server: float64(server) / t, GC: float64(gc) / t, Other: float64(total-server-gc) / t, Seconds: t / 1e9}
}

// stackHas reports whether a frame of s's stack is of a function whose
// name starts with prefix.
func stackHas(s *profile.Sample, prefix string) bool {
	for _, loc := range s.Location {
		for _, l := range loc.Line {
			if l.Function != nil && strings.HasPrefix(l.Function.Name, prefix) {
				return true
			}
		}
	}
	return false
}
