package volume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
)

// Attached is one volume of a session as the host mounts it: the volume's
// directory (Source) at Target in the sandbox.
type Attached struct {
	Source   string
	Target   string
	ReadOnly bool
}

// Attach registers session's mounts of tenant's volumes (checked with
// CheckMounts) and returns the directories to mount. A volume that does
// not exist is ErrInvalidArgument naming volumes[i].name; one another
// session mounts read-write, asked read-write again, another session's
// copy (CopyForSession), or one being created or removed, is
// ErrConflict; one removed since it was looked up is ErrInvalidArgument.
// On an error nothing is registered. Release undoes it.
func (s *Service) Attach(ctx context.Context, tenant, session string, ms []node.VolumeMount) ([]Attached, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	if err := CheckMounts(ms); err != nil {
		return nil, err
	}
	if err := s.supported(); err != nil {
		return nil, err
	}
	ids := make([]string, len(ms))
	out := make([]Attached, len(ms))
	for i, m := range ms {
		r, err := s.store.GetVolume(ctx, tenant, m.Name)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.InvalidField(fmt.Sprintf("volumes[%d].name", i), "volume %q does not exist", m.Name)
		}
		if err != nil {
			return nil, err
		}
		if r.Session != "" && r.Session != session {
			// Another mount would keep the copy from going with its
			// session.
			return nil, errdefs.Newf(errdefs.ErrConflict,
				"volume %q is session %s's copy, mounted by it alone (snapshot it and make a volume of that to mount its files elsewhere)",
				m.Name, r.Session)
		}
		ids[i] = r.LayerID
		out[i] = Attached{Source: s.layerPath(r.LayerID), Target: m.Path, ReadOnly: m.ReadOnly}
	}
	if attachLookedUp != nil {
		attachLookedUp()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// A remove may have run since the look-up, or be running: it holds
	// its name busy from before it checks for users until the layer is
	// gone, and it checks under s.mu, so a volume not busy and still
	// recorded with the same layer now cannot be removed until Release.
	for i, m := range ms {
		if s.busy[tenant+"/"+m.Name] {
			return nil, errdefs.Newf(errdefs.ErrConflict, "volume %q is being created or removed", m.Name)
		}
		r, err := s.store.GetVolume(ctx, tenant, m.Name)
		if errors.Is(err, errdefs.ErrNotFound) || err == nil && r.LayerID != ids[i] {
			return nil, errdefs.InvalidField(fmt.Sprintf("volumes[%d].name", i), "volume %q was removed", m.Name)
		}
		if err != nil {
			return nil, err
		}
	}
	for i, m := range ms {
		if w := s.writer[ids[i]]; !m.ReadOnly && w != "" && w != session {
			return nil, errdefs.Newf(errdefs.ErrConflict, "volume %q is mounted read-write by session %s (mount it read_only, or end that session)", m.Name, w)
		}
	}
	for i, m := range ms {
		s.registerLocked(ids[i], session, m.ReadOnly)
	}
	return out, nil
}

// attachLookedUp, when set (by tests), runs in Attach between its look-up
// of the volumes and their registration.
var attachLookedUp func()

// Adopt registers the mounts of session, a sandbox a new daemon adopted
// (its record's Volumes), without refusing a conflict (the mounts exist
// already): a conflict is logged.
func (s *Service) Adopt(ctx context.Context, tenant, session string, ms []node.VolumeMount, log *slog.Logger) {
	for _, m := range ms {
		r, err := s.store.GetVolume(ctx, tenant, m.Name)
		if err != nil {
			log.Warn("adopted session mounts a volume that is gone", "session", session, "volume", m.Name, "err", err)
			continue
		}
		s.mu.Lock()
		if w := s.writer[r.LayerID]; !m.ReadOnly && w != "" && w != session {
			log.Warn("two adopted sessions mount a volume read-write", "volume", m.Name, "sessions", []string{w, session})
		}
		s.registerLocked(r.LayerID, session, m.ReadOnly)
		s.mu.Unlock()
	}
}

// registerLocked records session's mount of layer id. s.mu is held.
func (s *Service) registerLocked(id, session string, readOnly bool) {
	if !readOnly {
		s.writer[id] = session
		return
	}
	if s.readers[id] == nil {
		s.readers[id] = map[string]bool{}
	}
	s.readers[id][session] = true
}

// Release forgets every mount of session (it ended or its create failed);
// releasing twice is fine.
func (s *Service) Release(session string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, w := range s.writer {
		if w == session {
			delete(s.writer, id)
		}
	}
	for id, rs := range s.readers {
		delete(rs, session)
		if len(rs) == 0 {
			delete(s.readers, id)
		}
	}
}

// layerPath is layer id's directory (supported has checked the driver).
func (s *Service) layerPath(id string) string {
	return s.storage.(storage.StableLayers).LayerPath(id)
}
