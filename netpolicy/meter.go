package netpolicy

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Event is one egress record: a connection (allowed, with its byte counts
// once it ends) or a refusal, or a DNS query.
type Event struct {
	// Time is when the connection or query started.
	Time time.Time
	// Kind is how the sandbox asked: "connect" (HTTP CONNECT), "http" (a
	// plain or transparent HTTP request's connection), "tls" (transparent
	// TLS, by SNI), "broker" (an upstream connection of the credential
	// broker, for a TLS connection it terminated) or "dns".
	Kind string
	// Host is the name the sandbox asked for (or the IP literal).
	Host string
	// Addr is the address connected to (or the DNS answer's first), empty
	// when none was.
	Addr string
	// Port is the destination port (53 for DNS).
	Port uint16
	// BytesUp and BytesDown are the bytes sent and received, in bytes.
	BytesUp, BytesDown int64
	// Decision is "allow" or "deny".
	Decision string
	// Reason says why a connection was refused or cut ("not in the
	// allow-list", "resolves to ... always blocked", "byte quota of N
	// bytes exceeded", ...); empty for a plain allow.
	Reason string
}

// The decisions of an Event.
const (
	DecisionAllow = "allow"
	DecisionDeny  = "deny"
)

// Sink receives a sandbox's egress events. Calls may come from many
// goroutines; an implementation must not block for long.
type Sink func(Event)

// meter enforces a sandbox's byte quota and connection rate and tracks its
// open connections so that they can be cut when the quota runs out or the
// sandbox stops.
type meter struct {
	maxBytes int64
	bytes    atomic.Int64
	// sandboxConns counts connections from the sandbox open now.
	sandboxConns atomic.Int64
	conns        *rate.Limiter // nil: no limit
	queries      *rate.Limiter // nil: no limit

	mu       sync.Mutex
	open     map[*countingConn]struct{}
	exceeded bool
	closed   bool
}

func newMeter(p *Policy) *meter {
	m := &meter{maxBytes: p.MaxBytes, open: map[*countingConn]struct{}{}}
	if n := p.MaxConnsPerMinute; n > 0 {
		m.conns = rate.NewLimiter(rate.Limit(float64(n)/60), n)
		m.queries = rate.NewLimiter(rate.Limit(float64(10*n)/60), 10*n)
	}
	return m
}

// admit reports "" when a new connection from the sandbox is within the
// rate limit, else why not. (The quota is checked when the connection asks
// for a destination, so that the refusal can say why.)
func (m *meter) admit() string {
	if m.conns != nil && !m.conns.Allow() {
		return "new-connection rate limit exceeded"
	}
	return ""
}

// admitQuery is admit for a DNS query.
func (m *meter) admitQuery() string {
	if r := m.quotaReason(); r != "" {
		return r
	}
	if m.queries != nil && !m.queries.Allow() {
		return "DNS query rate limit exceeded"
	}
	return ""
}

func (m *meter) quotaReason() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return "the sandbox's network is shut down"
	}
	if m.exceeded {
		return "egress byte quota exceeded"
	}
	return ""
}

// track registers c as open; false when the meter is closed or the quota
// is spent (the caller closes c).
func (m *meter) track(c *countingConn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed || m.exceeded {
		return false
	}
	m.open[c] = struct{}{}
	return true
}

func (m *meter) untrack(c *countingConn) {
	m.mu.Lock()
	delete(m.open, c)
	m.mu.Unlock()
}

// add counts n bytes; when the quota is passed it closes every open
// connection and returns true (once).
func (m *meter) add(n int64) bool {
	total := m.bytes.Add(n)
	if m.maxBytes <= 0 || total <= m.maxBytes {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.exceeded {
		return false
	}
	m.exceeded = true
	for c := range m.open {
		c.Close()
	}
	return true
}

// openBytes sums what the open connections moved so far.
func (m *meter) openBytes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for c := range m.open {
		n += c.up.Load() + c.down.Load()
	}
	return n
}

// close cuts every open connection and refuses new ones.
func (m *meter) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	for c := range m.open {
		c.Close()
	}
}

// countingConn counts what crosses it (Read: from the remote, down; Write:
// to the remote, up) into its meter and its own totals.
type countingConn struct {
	net.Conn
	m        *meter
	up, down atomic.Int64
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.down.Add(int64(n))
		c.m.add(int64(n))
	}
	return n, err
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.up.Add(int64(n))
		c.m.add(int64(n))
	}
	return n, err
}
