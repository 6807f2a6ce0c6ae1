package route

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/forkbox/forkbox/api/access"
	"github.com/forkbox/forkbox/defaults"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/node"
)

// Want is what a create needs of its host.
type Want struct {
	// Template is the template's name ("" is the base template).
	Template string
	// Tier is the isolation driver ("" the hosts' default).
	Tier string
	// MemoryMB is the session's memory limit in MiB (0: the default).
	MemoryMB int64
}

// capacityRetry is the Retry-After of a full fleet (as one host's).
const capacityRetry = 5 * time.Second

// Choose picks the host for a create wanting w among hosts (the
// registry's records; pending are the creates each host was given that
// its record may not count yet): placeable (ready, a compatible
// version), with w's tier and template (a record that lists no
// templates is taken to have every one) and a free session slot and
// memory for w; among those one with a ready warm-pool member of w's
// template first, then the least loaded (sessions over slots), then
// self, then by id. None fits: ErrUnavailable capacity-unavailable with
// a Retry-After.
func Choose(hosts []fleet.Host, pending map[string]int, self string, w Want) (fleet.Host, error) {
	tmpl := w.Template
	if tmpl == "" {
		tmpl = "base"
	}
	mem := w.MemoryMB
	if mem <= 0 {
		mem = defaults.Limits().DefaultMemoryMB
	}
	type cand struct {
		h    fleet.Host
		warm bool
		load float64
	}
	var cs []cand
	for _, h := range hosts {
		if !h.Placeable {
			continue
		}
		if w.Tier != "" && !slices.Contains(h.Tiers, w.Tier) {
			continue
		}
		if h.Templates != nil && !slices.Contains(h.Templates, tmpl) {
			continue
		}
		n := h.Load.Sessions + pending[h.ID]
		usedMB := h.Load.MemoryMB + int64(pending[h.ID])*defaults.Limits().DefaultMemoryMB
		if h.Capacity.Sessions > 0 && n+1 > h.Capacity.Sessions {
			continue
		}
		if h.Capacity.MemoryMB > 0 && usedMB+mem > h.Capacity.MemoryMB {
			continue
		}
		load := float64(n)
		if h.Capacity.Sessions > 0 {
			load = float64(n) / float64(h.Capacity.Sessions)
		}
		cs = append(cs, cand{h: h, warm: h.WarmReady[tmpl] > pending[h.ID], load: load})
	}
	if len(cs) == 0 {
		return fleet.Host{}, retryAfter(errdefs.Typed(errdefs.ErrUnavailable, node.ProblemCapacity,
			"no host of the fleet has the capacity, tier %q and template %q for this session", w.Tier, tmpl), capacityRetry)
	}
	sort.SliceStable(cs, func(i, j int) bool {
		a, b := cs[i], cs[j]
		if a.warm != b.warm {
			return a.warm
		}
		if a.load != b.load {
			return a.load < b.load
		}
		if (a.h.ID == self) != (b.h.ID == self) {
			return a.h.ID == self
		}
		return a.h.ID < b.h.ID
	})
	return cs[0].h, nil
}

// placements are the creates this host placed whose sessions a host's
// registry record may not count yet: each counts until that host's
// record is written a second after it (by then the session's record
// exists and the host's load has it), or for 30 s at most.
type placements struct {
	mu sync.Mutex
	at map[string][]time.Time
}

// pending returns, per host, the placements its record hs does not
// count yet, and forgets the others.
func (p *placements) pending(hs []fleet.Host) map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	now := time.Now()
	for _, h := range hs {
		keep := p.at[h.ID][:0]
		for _, t := range p.at[h.ID] {
			if h.Heartbeat.Before(t.Add(time.Second)) && now.Sub(t) < 30*time.Second {
				keep = append(keep, t)
			}
		}
		if p.at != nil {
			p.at[h.ID] = keep
		}
		out[h.ID] = len(keep)
	}
	return out
}

func (p *placements) add(host string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.at == nil {
		p.at = map[string][]time.Time{}
	}
	p.at[host] = append(p.at[host], time.Now())
}

// createBody is what placement reads of a create's body: forkbox's
// (template, isolation, memory_mb, snapshot) or E2B's (templateID).
type createBody struct {
	Template   string `json:"template"`
	Isolation  string `json:"isolation"`
	MemoryMB   int64  `json:"memory_mb"`
	Snapshot   string `json:"snapshot"`
	TemplateID string `json:"templateID"`
	// Host pins the create to a host (forkbox's wire only, admin keys).
	Host string `json:"host"`
	// Volumes and Secrets are the tenant's on the host they were made
	// through: a create naming any stays there.
	Volumes []json.RawMessage `json:"volumes"`
	Secrets []string          `json:"secrets"`
}

// maxPeek bounds the create body placement reads; a longer one is
// served here (and refused by the API's own limit).
const maxPeek = 1 << 20

// serveCreate places a create: a retry of one with the same
// Idempotency-Key (and key) through this host where the first went;
// next to its snapshot when it starts from
// one that another host holds (a fork; a `spread` option would choose
// among hosts that can pull the snapshot), here when that host cannot
// take it and the snapshot has a copy in the object store (pullHere),
// else on the host Choose
// picks. This host serves it itself when chosen, when the body cannot be
// read for placement, when it names a snapshot the directory does not
// know (by name: this host resolves it), volumes or secrets (they are
// per host, made through this one), a template or tier no host has
// or a memory out of the limits (this host answers, naming the field),
// or when the fleet's registry cannot be read (logged).
func (rt *Router) serveCreate(w http.ResponseWriter, r *http.Request, t target) {
	b, all, err := peekBody(r, maxPeek)
	if err != nil {
		rt.fail(w, r, t, errdefs.InvalidField("body", "could not be read: %v", err))
		return
	}
	var body createBody
	if !all || json.Unmarshal(b, &body) != nil {
		rt.o.Local.ServeHTTP(w, r)
		return
	}
	if body.Host != "" && !t.e2b {
		rt.servePinned(w, r, t, body.Host)
		return
	}
	ref := body.Snapshot
	if t.e2b {
		ref, body.Template = body.TemplateID, body.TemplateID
	}
	if ref != "" {
		if loc, ok := rt.locate(r.Context(), fleet.KindSnapshot, ref); ok {
			if rt.pullHere(r.Context(), loc) {
				rt.o.Local.ServeHTTP(w, r)
			} else {
				rt.forwardTo(w, r, t, loc.Host)
			}
			return
		}
		if !t.e2b {
			// A snapshot by name (or an unknown one): this host resolves it.
			rt.o.Local.ServeHTTP(w, r)
			return
		}
	}
	if len(body.Volumes) > 0 || len(body.Secrets) > 0 {
		// Volumes and secrets are per host: the client made them
		// through this one (their calls are not routed).
		rt.o.Local.ServeHTTP(w, r)
		return
	}
	// The caller's key first: what a create without a valid one asks
	// must not count as a pending placement nor take an idempotency
	// slot.
	if _, err := rt.authenticate(r, t.e2b); err != nil {
		rt.fail(w, r, t, err)
		return
	}
	idem := ""
	if k := r.Header.Get("Idempotency-Key"); k != "" {
		sum := sha256.Sum256([]byte(access.Secret(r, t.e2b) + "\n" + k))
		idem = hex.EncodeToString(sum[:])
		if host, ok := rt.idem.get(idem); ok {
			// A retry goes where the first try went, which answers it
			// from its record of that key.
			if host == rt.o.Self {
				rt.o.Local.ServeHTTP(w, r)
			} else {
				rt.forwardTo(w, r, t, host)
			}
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	hs, err := rt.hosts.get(ctx)
	cancel()
	if err != nil {
		rt.o.Log.Warn("fleet: host registry unreadable; placing the create here", "err", err)
		rt.o.Local.ServeHTTP(w, r)
		return
	}
	if !anyHas(hs, body.Template) {
		// No host has such a template: this host answers (an E2B
		// templateID may be a snapshot's name; else its 404).
		rt.o.Local.ServeHTTP(w, r)
		return
	}
	if l := defaults.Limits(); body.MemoryMB < 0 || body.MemoryMB > 0 && (body.MemoryMB < l.MinMemoryMB || body.MemoryMB > l.MaxMemoryMB) ||
		!anyTier(hs, body.Isolation) {
		// No host could ever take it (memory out of the limits, a tier
		// none has): this host answers its 400 naming the field, not a
		// 503 for the client to retry.
		rt.o.Local.ServeHTTP(w, r)
		return
	}
	h, err := Choose(hs, rt.placed.pending(hs), rt.o.Self, Want{Template: body.Template, Tier: body.Isolation, MemoryMB: body.MemoryMB})
	if err != nil {
		rt.fail(w, r, t, err)
		return
	}
	rt.placed.add(h.ID)
	if idem != "" {
		rt.idem.put(idem, h.ID)
	}
	if h.ID == rt.o.Self {
		rt.o.Local.ServeHTTP(w, r)
		return
	}
	rt.forwardTo(w, r, t, h.ID)
}

// maxIdempotent bounds how many Idempotency-Keys a router remembers.
const maxIdempotent = 4096

// idempotent remembers the host each recent create with an
// Idempotency-Key was placed on (keyed by a digest of the caller's key
// and the Idempotency-Key), the oldest forgotten first. A retry through
// another host is placed afresh (docs/ARCHITECTURE.md, Fleet).
type idempotent struct {
	mu    sync.Mutex
	host  map[string]string
	order []string
}

func (m *idempotent) get(k string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h, ok := m.host[k]
	return h, ok
}

func (m *idempotent) put(k, host string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.host == nil {
		m.host = map[string]string{}
	}
	if _, ok := m.host[k]; !ok {
		m.order = append(m.order, k)
	}
	m.host[k] = host
	for len(m.order) > maxIdempotent {
		delete(m.host, m.order[0])
		m.order = m.order[1:]
	}
}

// anyHas reports whether some host of hs has template tmpl ("" is the
// base template), or does not say which templates it has.
func anyHas(hs []fleet.Host, tmpl string) bool {
	if tmpl == "" {
		tmpl = "base"
	}
	for _, h := range hs {
		if h.Templates == nil || slices.Contains(h.Templates, tmpl) {
			return true
		}
	}
	return false
}

// servePinned serves a create that names its host (v1.CreateRequest.Host):
// here when it is this host (whose API checks the caller is an admin),
// else forwarded there once the caller is an admin and the host can
// take sessions. A host the registry does not have is ErrInvalidArgument
// naming "host"; one that is lost, draining or of another version is
// ErrUnavailable.
func (rt *Router) servePinned(w http.ResponseWriter, r *http.Request, t target, host string) {
	if host == rt.o.Self {
		rt.o.Local.ServeHTTP(w, r)
		return
	}
	caller, err := rt.authenticate(r, false)
	if err != nil {
		rt.fail(w, r, t, err)
		return
	}
	if !caller.Admin {
		rt.fail(w, r, t, errdefs.Newf(errdefs.ErrPermissionDenied, "choosing the host of a session (field host) needs an admin key"))
		return
	}
	hs, err := rt.hosts.get(r.Context())
	if err != nil {
		rt.fail(w, r, t, err)
		return
	}
	for _, h := range hs {
		if h.ID != host {
			continue
		}
		if !h.Placeable {
			rt.fail(w, r, t, retryAfter(errdefs.Typed(errdefs.ErrUnavailable, node.ProblemCapacity,
				"host %s takes no sessions now (it is %s)", host, h.State), capacityRetry))
			return
		}
		rt.placed.add(h.ID)
		rt.proxy(w, r, t, h, caller)
		return
	}
	rt.fail(w, r, t, errdefs.InvalidField("host", "%q is not a host of this fleet (GET /v1/hosts lists them)", host))
}

// anyTier reports whether some host of hs has isolation tier tier (""
// is every host's default).
func anyTier(hs []fleet.Host, tier string) bool {
	if tier == "" {
		return true
	}
	for _, h := range hs {
		if slices.Contains(h.Tiers, tier) {
			return true
		}
	}
	return false
}
