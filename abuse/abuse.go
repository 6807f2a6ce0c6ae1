// Package abuse decides, from what the host can see of a sandbox, whether
// it is being used for abuse (the system design's section 7.5, NFR-04:
// decided within 60 s):
//
//   - mining: the sandbox's CPU use stays near its quota (CPUFraction over
//     SustainedCPU) while a mining signal was seen within Window: a process
//     named like a known miner, a command line with a stratum URL, or a
//     connection the egress proxy let through to a known mining pool
//     (refused attempts and DNS lookups are no signal: content an agent
//     reads can make it try any URL);
//   - scanning: at least ScanDenied refused egress attempts to at least
//     ScanDestinations different destinations within Window, counting
//     only destinations named by address or on ports other than 80 and
//     443 (a browser agent refused on many web sites by name is no
//     scanner);
//   - fork-bomb: the pids limit refused forks, or the sandbox sat at its
//     limit, in at least PidsHits separate samples within Window (a limit
//     hit once is contained; one hit again and again is an attack); or the
//     sandbox stopped because its tasks reached the host's pids limit
//     (PidsLimitStop: a gVisor sandbox whose tasks got past the limit
//     inside, for example by forking under many users).
//
// The Detector only decides; the host monitor (package monitor) samples
// every running sandbox each Interval, kills on a verdict, flags the
// tenant and records it. It is safe for concurrent use.
package abuse

import (
	"fmt"
	"net"
	"net/netip"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Config tunes the detector. Zero fields take DefaultConfig's values.
type Config struct {
	// Interval is how often the monitor samples each sandbox.
	Interval time.Duration
	// Window is how long evidence counts.
	Window time.Duration
	// SustainedCPU is how long CPU use must stay at CPUFraction of the
	// sandbox's quota, together with a mining signal.
	SustainedCPU time.Duration
	CPUFraction  float64
	// ScanDenied refused connections to ScanDestinations destinations.
	ScanDenied       int
	ScanDestinations int
	// PidsHits is how many samples with new pids-limit refusals make a
	// fork bomb.
	PidsHits int
	// MinerNames are process names (or prefixes of them) of known miners.
	MinerNames []string
	// PoolDomains are mining pools' domains (a name under one counts).
	PoolDomains []string
}

// DefaultConfig samples every 5 s and kills a miner after 20 s at half
// its CPU quota or more: a decision within 30 s of the start, well inside
// NFR-04's 60 s. Half, not all: on a busy host a miner gets less than
// its quota, and the mining signal, not the CPU, is the evidence.
func DefaultConfig() Config {
	return Config{
		Interval: 5 * time.Second, Window: 60 * time.Second,
		SustainedCPU: 20 * time.Second, CPUFraction: 0.5,
		ScanDenied: 30, ScanDestinations: 10, PidsHits: 3,
		MinerNames: []string{"xmrig", "xmr-stak", "minerd", "cpuminer", "cgminer", "bfgminer", "ccminer", "ethminer",
			"nbminer", "lolminer", "t-rex", "phoenixminer", "nanominer", "teamredminer", "srbminer", "gminer",
			"kdevtmpfsi", "kinsing", "xmrminer", "moneroocean"},
		PoolDomains: []string{"minexmr.com", "supportxmr.com", "nanopool.org", "2miners.com", "f2pool.com",
			"ethermine.org", "moneroocean.stream", "hashvault.pro", "c3pool.com", "herominers.com", "unmineable.com",
			"xmrpool.eu", "minergate.com", "nicehash.com", "prohashing.com", "viabtc.com", "antpool.com",
			"poolin.com", "slushpool.com", "braiins.com", "miningpoolhub.com", "zpool.ca", "zergpool.com"},
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Interval <= 0 {
		c.Interval = d.Interval
	}
	if c.Window <= 0 {
		c.Window = d.Window
	}
	if c.SustainedCPU <= 0 {
		c.SustainedCPU = d.SustainedCPU
	}
	if c.CPUFraction <= 0 {
		c.CPUFraction = d.CPUFraction
	}
	if c.ScanDenied <= 0 {
		c.ScanDenied = d.ScanDenied
	}
	if c.ScanDestinations <= 0 {
		c.ScanDestinations = d.ScanDestinations
	}
	if c.PidsHits <= 0 {
		c.PidsHits = d.PidsHits
	}
	if c.MinerNames == nil {
		c.MinerNames = d.MinerNames
	}
	if c.PoolDomains == nil {
		c.PoolDomains = d.PoolDomains
	}
	return c
}

// Patterns a Verdict names.
const (
	Mining   = "mining"
	Scanning = "scanning"
	ForkBomb = "fork-bomb"
)

// Verdict is a decision that a sandbox is abused.
type Verdict struct {
	// Pattern is Mining, Scanning or ForkBomb.
	Pattern string
	// Reason says what was seen, for the session's end detail.
	Reason string
}

// Sample is one reading of a sandbox, taken from the host.
type Sample struct {
	Time time.Time
	// CPUSeconds is the CPU it has used in all, in CPU-seconds; CPULimit
	// its quota in cores.
	CPUSeconds float64
	CPULimit   float64
	// PidsLimitHits counts forks refused at its pids limit so far; Pids
	// is its task count now and PidsLimit its limit (0: unknown).
	PidsLimitHits   int64
	Pids, PidsLimit int64
}

// Process is a process name and command line, for the mining check.
type Process struct{ Name, Cmdline string }

// Detector holds each sandbox's recent evidence.
type Detector struct {
	cfg Config
	mu  sync.Mutex
	by  map[string]*evidence
}

type evidence struct {
	samples  []Sample
	pidsHits []time.Time // samples whose PidsLimitHits grew
	denied   []denial
	signal   string // the latest mining signal
	signalAt time.Time
}

type denial struct {
	at   time.Time
	dest string
}

// New returns a detector with cfg (zero fields: DefaultConfig's).
func New(cfg Config) *Detector {
	return &Detector{cfg: cfg.withDefaults(), by: map[string]*evidence{}}
}

// Config returns the detector's configuration, defaults filled in.
func (d *Detector) Config() Config { return d.cfg }

func (d *Detector) get(id string) *evidence {
	e := d.by[id]
	if e == nil {
		e = &evidence{}
		d.by[id] = e
	}
	return e
}

// Egress is one egress event of a sandbox, as the egress proxy saw it.
type Egress struct {
	Time time.Time
	// Host is the name or address asked for; Port the destination port.
	Host string
	Port int
	// Allowed: the proxy let it through; DNS: it was a DNS query.
	Allowed, DNS bool
}

// maxDenials bounds the refusals kept per sandbox (a flood beyond it is
// scanning or not by the time it is reached).
const maxDenials = 4096

// Egress notes egress event ev of sandbox id: an allowed connection to a
// mining pool is a mining signal; a refused connection to an address or
// a non-web port counts toward scanning.
func (d *Detector) Egress(id string, ev Egress) {
	if ev.DNS {
		return
	}
	h := strings.TrimSuffix(strings.ToLower(ev.Host), ".")
	d.mu.Lock()
	defer d.mu.Unlock()
	e := d.get(id)
	if ev.Allowed {
		for _, dom := range d.cfg.PoolDomains {
			if h == dom || strings.HasSuffix(h, "."+dom) {
				e.signal, e.signalAt = fmt.Sprintf("connection to mining pool %s", h), ev.Time
			}
		}
		return
	}
	_, err := netip.ParseAddr(strings.Trim(h, "[]"))
	if (err == nil || (ev.Port != 80 && ev.Port != 443)) && len(e.denied) < maxDenials {
		e.denied = append(e.denied, denial{at: ev.Time, dest: net.JoinHostPort(h, strconv.Itoa(ev.Port))})
	}
}

// minerSignal returns a mining signal among procs, or "".
func (d *Detector) minerSignal(procs []Process) string {
	for _, p := range procs {
		names := []string{strings.ToLower(p.Name)}
		if f := strings.Fields(p.Cmdline); len(f) > 0 {
			names = append(names, strings.ToLower(path.Base(f[0])))
		}
		for _, n := range names {
			for _, m := range d.cfg.MinerNames {
				if n == m || strings.HasPrefix(n, m) {
					return fmt.Sprintf("process %q looks like a cryptocurrency miner", n)
				}
			}
		}
		if c := strings.ToLower(p.Cmdline); strings.Contains(c, "stratum+tcp://") || strings.Contains(c, "stratum+ssl://") {
			return fmt.Sprintf("process %q has a stratum mining URL", p.Name)
		}
	}
	return ""
}

// Observe adds sample s of sandbox id and decides. procs lists its
// processes; it is called only when the CPU use is sustained, since
// listing costs more than sampling. nil: no abuse seen.
func (d *Detector) Observe(id string, s Sample, procs func() []Process) *Verdict {
	d.mu.Lock()
	e := d.get(id)
	cut := s.Time.Add(-d.cfg.Window)
	// A sample hits the limit when forks were refused since the last one,
	// or when the sandbox sits at its limit (a bomb that filled it).
	grew := len(e.samples) > 0 && s.PidsLimitHits > e.samples[len(e.samples)-1].PidsLimitHits
	if grew || (s.PidsLimit > 0 && s.Pids >= s.PidsLimit) {
		e.pidsHits = append(e.pidsHits, s.Time)
	}
	e.samples = append(e.samples, s)
	e.samples = dropBefore(e.samples, cut, func(x Sample) time.Time { return x.Time })
	e.pidsHits = dropBefore(e.pidsHits, cut, func(t time.Time) time.Time { return t })
	e.denied = dropBefore(e.denied, cut, func(x denial) time.Time { return x.at })
	if len(e.pidsHits) >= d.cfg.PidsHits {
		d.mu.Unlock()
		return &Verdict{Pattern: ForkBomb, Reason: fmt.Sprintf("the pids limit refused forks in %d samples within %s",
			len(e.pidsHits), d.cfg.Window)}
	}
	if v := d.scanning(e); v != nil {
		d.mu.Unlock()
		return v
	}
	busy := d.sustained(e.samples)
	d.mu.Unlock()
	if !busy {
		return nil
	}
	sig := ""
	if procs != nil {
		sig = d.minerSignal(procs())
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if sig != "" {
		e.signal, e.signalAt = sig, s.Time
	}
	if e.signal == "" || e.signalAt.Before(cut) {
		return nil
	}
	return &Verdict{Pattern: Mining, Reason: fmt.Sprintf("cryptocurrency mining: CPU busy (%.0f%% of its quota or more) for %s and %s",
		d.cfg.CPUFraction*100, d.cfg.SustainedCPU, e.signal)}
}

// sustained reports whether the samples show CPU use at CPUFraction of
// the quota over at least SustainedCPU.
func (d *Detector) sustained(samples []Sample) bool {
	if len(samples) < 2 {
		return false
	}
	last := samples[len(samples)-1]
	for i := len(samples) - 2; i >= 0; i-- {
		first := samples[i]
		span := last.Time.Sub(first.Time)
		if span < d.cfg.SustainedCPU {
			continue
		}
		used := last.CPUSeconds - first.CPUSeconds
		return last.CPULimit > 0 && used >= d.cfg.CPUFraction*last.CPULimit*span.Seconds()
	}
	return false
}

func (d *Detector) scanning(e *evidence) *Verdict {
	total := len(e.denied)
	dests := map[string]bool{}
	for _, x := range e.denied {
		dests[x.dest] = true
	}
	if total >= d.cfg.ScanDenied && len(dests) >= d.cfg.ScanDestinations {
		return &Verdict{Pattern: Scanning, Reason: fmt.Sprintf("network scanning: %d refused connections to %d destinations within %s",
			total, len(dests), d.cfg.Window)}
	}
	return nil
}

// PidsLimitStop decides about sandbox id, which stopped because its
// tasks reached the host's pids limit: the limit inside the sandbox sits
// well below the host's, so only tasks made to get past it (a bomb under
// many users) get there; that is a fork bomb whatever the samples say.
// It drops the sandbox's evidence.
func (d *Detector) PidsLimitStop(id string) Verdict {
	d.Forget(id)
	return Verdict{Pattern: ForkBomb, Reason: "the sandbox's tasks reached its pids limit on the host " +
		"(past the limit of each user inside it), which stopped the sandbox"}
}

// Forget drops sandbox id's evidence (it ended).
func (d *Detector) Forget(id string) {
	d.mu.Lock()
	delete(d.by, id)
	d.mu.Unlock()
}

// dropBefore removes the leading elements older than cut.
func dropBefore[T any](xs []T, cut time.Time, at func(T) time.Time) []T {
	i := 0
	for i < len(xs) && at(xs[i]).Before(cut) {
		i++
	}
	return xs[i:]
}
