package route

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/fleet"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/tenancy"
)

// replicateWait bounds how long a migration waits for its snapshot's
// copy to reach the object store.
const replicateWait = 3 * time.Minute

// migrateTimeout bounds a migration once its source is paused (the wait
// for the copy, the start on the target, the source's destroy); it runs
// on when the caller goes away.
const migrateTimeout = replicateWait + 3*time.Minute

// memoryDriver is the isolation driver whose sessions migrate with their
// processes and memory (gVisor's checkpoints); any other driver's
// migrate with their files only.
const memoryDriver = "gvisor"

// Migrate moves session id, which this host holds, to host target ("":
// the host Choose picks among the placeable others) and returns the new
// session as the target answered it. It snapshots the session (a running
// gVisor session with its memory, then pauses it; any other is paused
// first and snapshotted with its files only, so on runc its processes
// restart from the image's start), waits until the snapshot's copy is in the
// object store (its directory entry Replicated), starts a session from it
// on the target by a request signed as from this host with the source's
// settings (template, env, metadata, timeout left, network; its tenant as
// the caller), then destroys the source and deletes the snapshot (the
// target keeps the copy it imported, which its session starts from). The
// new session has a new id.
//
// Errors: ErrInvalidArgument on field "host" for this host itself or a
// malformed id; ErrNotFound for a target not in the registry;
// ErrUnavailable for a lost or draining target, a fleet with no other
// placeable host, a directory that cannot be read, or a copy that is not
// replicated in time. A failure before the target answers leaves the
// source as it was (resumed) and nothing on the target. Once the source
// is paused the move no longer follows ctx: it goes on, at most
// migrateTimeout, when the caller goes away.
func (rt *Router) Migrate(ctx context.Context, n node.Node, id, target string) (*v1.Session, error) {
	s, err := n.Get(ctx, id)
	if err != nil {
		return nil, err
	}
	if s.State != node.StateRunning && s.State != node.StatePaused {
		return nil, errdefs.Newf(errdefs.ErrConflict, "session %s is %s: only a running or paused session migrates", id, s.State)
	}
	h, err := rt.migrationTarget(ctx, s, target)
	if err != nil {
		return nil, err
	}
	if !rt.moving.start(id) {
		return nil, errdefs.Newf(errdefs.ErrConflict, "session %s is migrating already", id)
	}
	defer rt.moving.end(id)
	wasPaused := s.State == node.StatePaused
	// A memory checkpoint is taken of a running session (it stops it for
	// the moment it takes) and the source is paused right after; a files
	// snapshot is taken of the paused session. A paused gVisor session
	// moves its files only.
	memory := s.Driver == memoryDriver && !wasPaused
	pause := func() error {
		if wasPaused {
			return nil
		}
		if _, err := n.Pause(ctx, id); err != nil {
			return fmt.Errorf("migrate %s: pause: %w", id, err)
		}
		return nil
	}
	if !memory {
		if err := pause(); err != nil {
			return nil, err
		}
	}
	// From here a failure resumes the source, whatever ctx does, and the
	// move goes on when the client goes away: a start cut off midway
	// could leave a session on the target nobody knows of.
	bg := context.WithoutCancel(ctx)
	ctx, cancel := context.WithTimeout(bg, migrateTimeout)
	defer cancel()
	undo := func(snap string) {
		if snap != "" {
			if err := n.DeleteSnapshot(bg, snap, false); err != nil {
				rt.o.Log.Warn("fleet: migrate: delete the migration snapshot", "session", id, "snapshot", snap, "err", err)
			}
		}
		if !wasPaused {
			if _, err := n.Resume(bg, id); err != nil && !errors.Is(err, errdefs.ErrConflict) {
				rt.o.Log.Warn("fleet: migrate: resume the source", "session", id, "err", err)
			}
		}
	}
	sn, err := n.Snapshot(ctx, id, node.SnapshotOptions{Memory: memory, ExpiresIn: time.Hour})
	if err != nil {
		if !memory {
			undo("")
		}
		return nil, fmt.Errorf("migrate %s: snapshot: %w", id, err)
	}
	if memory {
		if err := pause(); err != nil {
			undo(sn.ID)
			return nil, err
		}
	}
	if err := rt.waitReplicated(ctx, sn.ID); err != nil {
		undo(sn.ID)
		return nil, err
	}
	out, err := rt.startOn(ctx, h, s, sn.ID)
	if err != nil {
		undo(sn.ID)
		return nil, err
	}
	if err := n.Destroy(bg, id); err != nil {
		// Two copies must not run on: the new one goes, the source resumes.
		rt.o.Log.Warn("fleet: migrate: destroy the source failed; ending the new session", "session", id, "new", out.ID, "err", err)
		if derr := rt.signed(bg, h, http.MethodDelete, "/v1/sessions/"+url.PathEscape(out.ID), s.Tenant, nil, nil); derr != nil {
			rt.o.Log.Warn("fleet: migrate: destroy the new session", "host", h.ID, "session", out.ID, "err", derr)
		}
		undo(sn.ID)
		return nil, fmt.Errorf("migrate %s: destroy the source: %w", id, err)
	}
	if err := n.DeleteSnapshot(bg, sn.ID, false); err != nil {
		rt.o.Log.Warn("fleet: migrate: delete the migration snapshot (it expires in an hour)", "snapshot", sn.ID, "err", err)
	}
	rt.o.Log.Info("fleet: session migrated", "session", id, "host", h.ID, "new", out.ID)
	return out, nil
}

// migrationTarget returns the registry record of the host s moves to:
// target when named (ready, not this host), else Choose's pick among
// the others for s's template, driver and memory.
func (rt *Router) migrationTarget(ctx context.Context, s *node.Session, target string) (fleet.Host, error) {
	if target == rt.o.Self {
		return fleet.Host{}, errdefs.InvalidField("host", "%s is the host session %s is on already", target, s.ID)
	}
	if target != "" {
		if err := fleet.ValidID("host", target); err != nil {
			return fleet.Host{}, err
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	hs, err := rt.hosts.get(rctx)
	if err != nil {
		return fleet.Host{}, err
	}
	var others []fleet.Host
	for _, h := range hs {
		if h.ID == rt.o.Self {
			continue
		}
		if h.ID == target {
			if !h.Placeable {
				return fleet.Host{}, retryAfter(errdefs.Typed(errdefs.ErrUnavailable, "",
					"host %s is %s: it takes no sessions now", h.ID, h.State), 5*time.Second)
			}
			return h, nil
		}
		others = append(others, h)
	}
	if target != "" {
		return fleet.Host{}, errdefs.Newf(errdefs.ErrNotFound, "host %s is not in the fleet's host registry", target)
	}
	return Choose(others, rt.placed.pending(others), rt.o.Self, Want{Template: s.Template, Tier: s.Driver, MemoryMB: s.MemoryMB})
}

// waitReplicated polls snapshot id's directory entry until it says the
// copy is in the object store (ErrUnavailable after replicateWait).
func (rt *Router) waitReplicated(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, replicateWait)
	defer cancel()
	var last error
	for {
		if dir, err := rt.o.Directory(); err != nil {
			last = err
		} else if l, err := dir.Get(ctx, fleet.KindSnapshot, id); err != nil {
			last = err
		} else if l.Replicated && l.Digest != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return errdefs.Newf(errdefs.ErrUnavailable, "migration snapshot %s was not copied to the fleet's object store in %v (last: %v)", id, replicateWait, last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// startOn creates a session from snapshot snap on h with src's settings
// (limits, user, workdir, isolation driver, egress policy, env, metadata,
// timeouts), src's tenant the caller. Secrets and volumes are per host
// and are not carried.
func (rt *Router) startOn(ctx context.Context, h fleet.Host, src *node.Session, snap string) (*v1.Session, error) {
	req := v1.CreateRequest{Snapshot: snap, Env: src.Env, Metadata: src.Metadata, DiskMB: src.DiskMB,
		AutoPauseS: src.AutoPauseS, OnTimeout: src.OnTimeout, AutoResume: src.AutoResume, PublicTraffic: src.PublicTraffic,
		CPU: src.CPU, MemoryMB: src.MemoryMB, Pids: src.Pids, User: src.DefaultUser, Workdir: src.Workdir,
		Isolation: src.Driver}
	if n := src.Network; n != nil && (len(n.Allow) > 0 || n.MaxEgressBytes > 0 || n.MaxConnectionsPerMinute > 0) {
		req.Network = &v1.Network{Allow: append([]string(nil), n.Allow...), MaxEgressBytes: n.MaxEgressBytes,
			MaxConnectionsPerMinute: n.MaxConnectionsPerMinute}
	}
	left := src.Remaining
	if src.State == node.StateRunning && !src.ExpiresAt.IsZero() {
		left = time.Until(src.ExpiresAt)
	}
	if left > 0 {
		req.TimeoutS = max(1, int64(left/time.Second))
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	out := &v1.Session{}
	if err := rt.signed(ctx, h, http.MethodPost, "/v1/sessions", src.Tenant, body, out); err != nil {
		return nil, fmt.Errorf("migrate %s: start on host %s: %w", src.ID, h.ID, err)
	}
	return out, nil
}

// signed sends a request to h's API signed as from this host with tenant
// as the caller, decoding a 2xx answer's JSON into out (nil: none); any
// other answer is an error of the class of its status.
func (rt *Router) signed(ctx context.Context, h fleet.Host, method, path, tenant string, body []byte, out any) error {
	base := strings.TrimSuffix(h.API, "/")
	if base == "" {
		return errdefs.Newf(errdefs.ErrUnavailable, "host %s has no API URL", h.ID)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+path, bytes.NewReader(body))
	if err != nil {
		return errdefs.Newf(errdefs.ErrUnavailable, "host %s API URL %q: %v", h.ID, h.API, err)
	}
	req.Header.Set("Content-Type", "application/json")
	rt.signer.Sign(req.Header, h.ID, method, req.URL.RequestURI(), tenancy.Caller{Tenant: tenant}, true)
	resp, err := (&http.Client{Transport: rt.transport}).Do(req)
	if err != nil {
		return errdefs.Newf(errdefs.ErrUnavailable, "host %s did not answer: %v", h.ID, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return errdefs.Newf(classOf(resp.StatusCode), "host %s answered %s: %s", h.ID, resp.Status, strings.TrimSpace(string(b)))
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return errdefs.Newf(errdefs.ErrUnavailable, "host %s answered a body that is no session: %v", h.ID, err)
	}
	return nil
}

// fence is the set of sessions this host is migrating: the router
// serves them nothing but their info (infoCall) until the move ends.
type fence struct {
	mu  sync.Mutex
	ids map[string]bool
}

// start adds id and reports whether it was not there already.
func (f *fence) start(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ids[id] {
		return false
	}
	if f.ids == nil {
		f.ids = map[string]bool{}
	}
	f.ids[id] = true
	return true
}

// end removes id.
func (f *fence) end(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.ids, id)
}

// has reports whether id is migrating.
func (f *fence) has(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ids[id]
}

// classOf maps a peer's HTTP status to an error class. Its 401 (this
// host's signature refused: the hosts' fleet secrets differ) and other
// failures are the fleet's, ErrUnavailable.
func classOf(status int) error {
	switch status {
	case http.StatusBadRequest:
		return errdefs.ErrInvalidArgument
	case http.StatusNotFound:
		return errdefs.ErrNotFound
	case http.StatusConflict:
		return errdefs.ErrConflict
	case http.StatusForbidden: // the tenant's policy on that host
		return errdefs.ErrPermissionDenied
	case http.StatusInsufficientStorage:
		return errdefs.ErrInsufficientStorage
	case http.StatusTooManyRequests:
		return errdefs.ErrResourceExhausted
	}
	return errdefs.ErrUnavailable
}
