package snapshot

import (
	"context"
	"errors"
	"sync"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// MaxForks bounds one fork request (sessions).
const MaxForks = 64

// Fork starts count sessions from snapshot ref (an id or a name), each as
// spec would create it (spec.Snapshot and spec.Template must be empty).
// The snapshot's integrity is checked once. All or nothing: when one
// session fails, the others are destroyed and the error returned.
func (s *Service) Fork(ctx context.Context, ref string, count int, spec node.CreateSpec) ([]*node.Session, error) {
	if count < 1 || count > MaxForks {
		return nil, errdefs.InvalidField("count", "must be between 1 and %d", MaxForks)
	}
	if spec.Snapshot != "" || spec.Template != "" {
		return nil, errdefs.InvalidField("template", "a fork starts from the snapshot; template and snapshot cannot be set")
	}
	sn, err := s.Resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	if err := s.storage.Verify(ctx, sn.ID); err != nil {
		return nil, err
	}
	spec.Snapshot = sn.ID
	out := make([]*node.Session, count)
	errs := make([]error, count)
	var wg sync.WaitGroup
	for i := 0; i < count; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			out[i], errs[i] = s.core.CreateVerified(ctx, spec)
		}(i)
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, rec := range out {
			if rec != nil {
				_ = s.core.Destroy(context.WithoutCancel(ctx), rec.ID)
			}
		}
		return nil, firstError(errs)
	}
	return out, nil
}

// firstError returns the first non-nil error (its class decides the answer).
func firstError(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// ForkSession snapshots session id (with opts) and starts count sessions
// from the snapshot (which stays, so more can be forked later; with
// opts.ExpiresIn it is collected once expired and unused). Settings spec
// leaves unset are the source session's.
func (s *Service) ForkSession(ctx context.Context, id string, count int, spec node.CreateSpec, opts node.SnapshotOptions) (*node.Snapshot, []*node.Session, error) {
	if count < 1 || count > MaxForks {
		return nil, nil, errdefs.InvalidField("count", "must be between 1 and %d", MaxForks)
	}
	src, err := s.core.Get(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	// Refuse a request the forks would refuse before taking the snapshot.
	check := inherit(*src, spec)
	if err := s.core.CheckCreate(&check); err != nil {
		return nil, nil, err
	}
	if opts.Memory && check.Isolation != src.Driver {
		return nil, nil, errdefs.InvalidField("isolation", "forks of a memory snapshot run on the session's own driver, %q", src.Driver)
	}
	// The snapshot stays provisional until the forks are made: a daemon
	// that stops in between (a crash; nobody learned the snapshot's id)
	// leaves it for the next start to reclaim (reclaimForks).
	sn, err := s.take(ctx, id, opts, true)
	if err != nil {
		return nil, nil, err
	}
	sessions, err := s.Fork(ctx, sn.ID, count, inherit(*src, spec))
	if err != nil {
		// The snapshot was made for these forks only (a refusal at the
		// tenant's limit must not leave snapshots behind).
		if derr := s.DeleteSnapshot(context.WithoutCancel(ctx), sn.ID, true); derr != nil {
			s.log.Warn("delete the snapshot of a failed fork", "snapshot", sn.ID, "err", derr)
		}
		return nil, nil, err
	}
	if err := s.store.KeepSnapshot(context.WithoutCancel(ctx), sn.ID); err != nil {
		// The forks run; a restart now would give the snapshot an expiry
		// rather than delete it (its sessions use it).
		s.log.Warn("keep the snapshot of a fork", "snapshot", sn.ID, "err", err)
	}
	sn.Provisional = false
	return sn, sessions, nil
}

// inherit fills spec's unset fields from rec.
func inherit(rec node.Session, spec node.CreateSpec) node.CreateSpec {
	if spec.CPU == 0 {
		spec.CPU = rec.CPU
	}
	if spec.MemoryMB == 0 {
		spec.MemoryMB = rec.MemoryMB
	}
	if spec.Pids == 0 {
		spec.Pids = rec.Pids
	}
	if spec.TimeoutS == 0 {
		spec.TimeoutS = rec.TimeoutS
	}
	if spec.DiskMB == 0 {
		spec.DiskMB = rec.DiskMB
	}
	if spec.User == "" {
		spec.User = rec.DefaultUser
	}
	if spec.Workdir == "" {
		spec.Workdir = rec.Workdir
	}
	if spec.Env == nil {
		spec.Env = rec.Env
	}
	// An allow-list emptied on a running session (node.SetNetwork) allows
	// nothing: its forks get no network, which allows nothing too.
	if spec.Network == nil && rec.Network != nil && len(rec.Network.Allow) > 0 {
		n := *rec.Network
		n.Allow = append([]string(nil), rec.Network.Allow...)
		n.Secrets = append([]string(nil), rec.Network.Secrets...) // (each fork gets new placeholders)
		spec.Network = &n
	}
	if spec.Metadata == nil {
		spec.Metadata = rec.Metadata
	}
	if spec.OnTimeout == "" {
		spec.OnTimeout, spec.AutoResume = rec.OnTimeout, rec.AutoResume
	}
	if spec.Isolation == "" {
		spec.Isolation = rec.Driver
	}
	spec.PublicTraffic = spec.PublicTraffic || rec.PublicTraffic
	return spec
}
