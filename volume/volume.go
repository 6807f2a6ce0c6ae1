// Package volume keeps tenants' persistent volumes: directories that
// outlive the sessions mounting them, each with its own disk quota, each
// mounted read-write by one session at a time and read-only by any
// number. A volume is a writable layer of the storage driver (its id
// starts with LayerPrefix) prepared from an empty template, so its quota is
// the driver's (btrfs qgroups) and the daemon's sweep of orphaned layers
// knows which ones are volumes (OwnsLayer). The database keeps the API view
// (store.VolumeRow); which session mounts what is held in memory and
// rebuilt from the live sessions' records when the daemon starts (Adopt).
package volume

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/store"
)

const (
	// LayerPrefix starts the storage layer id of every volume. It cannot
	// start a session id or a template name, so no other layer has it.
	LayerPrefix = "_vol"
	// scratchTemplate is the storage template volumes are prepared from:
	// an empty directory owned by the sandbox's user.
	scratchTemplate = "_volume"
	// MinSizeMB and MaxSizeMB bound a volume's size, in MiB.
	MinSizeMB = 1
	MaxSizeMB = 1 << 20
	// MaxMounts bounds the volumes one session mounts.
	MaxMounts = 16
)

// Service manages volumes. Create one with New.
type Service struct {
	store   *store.Store
	storage storage.Driver
	shift   storage.IDShift
	dir     string // where the scratch template's directory is made

	quota QuotaFunc // nil: no tenant limit

	mu      sync.Mutex
	writer  map[string]string          // layer id -> the session mounting it read-write
	readers map[string]map[string]bool // layer id -> sessions mounting it read-only
	busy    map[string]bool            // tenant/name being created or removed
}

// New returns a service over st and drv; shift owns the volume's root
// directory (the sandbox user's host ids); dir is a directory of the
// daemon's where the empty template is staged.
func New(st *store.Store, drv storage.Driver, shift storage.IDShift, dir string) *Service {
	return &Service{store: st, storage: drv, shift: shift, dir: dir,
		writer: map[string]string{}, readers: map[string]map[string]bool{}, busy: map[string]bool{}}
}

// QuotaFunc takes a place for one more of what ("volumes") of tenant
// against its policy, or refuses (429 tenant-quota-exceeded); count says
// how many it keeps now; release undoes it once the new one is recorded
// or failed (admission.Controller.ReserveQuota).
type QuotaFunc func(ctx context.Context, tenant, what string, count func() (int, error)) (release func(), err error)

// UseQuota makes every volume create, copies for sessions included, count
// against the tenant's max_volumes through q. Call it before the service
// is used.
func (s *Service) UseQuota(q QuotaFunc) { s.quota = q }

// supported says why the storage driver cannot hold volumes (nil when it
// can): a volume's directory must stay where Prepare put it across daemon
// restarts, which a btrfs subvolume does and an overlay mount does not.
// It is a 400, not a 503: the request cannot succeed on this daemon
// however often it is retried.
func (s *Service) supported() error {
	if _, ok := s.storage.(storage.StableLayers); !ok {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "volumes need the btrfs storage driver (serve --storage btrfs); this daemon runs %s", s.storage.Name())
	}
	return nil
}

// OwnsLayer reports whether storage layer id is a volume's: the daemon's
// sweep of layers no session owns leaves those of volumes that exist and
// removes the others (a create that stopped before its record was made).
func (s *Service) OwnsLayer(ctx context.Context, id string) bool {
	if !strings.HasPrefix(id, LayerPrefix) {
		return false
	}
	rows, err := s.store.ListVolumes(ctx, "")
	if err != nil {
		return true // keep it: a database error must not delete data
	}
	for _, r := range rows {
		if r.LayerID == id {
			return true
		}
	}
	return false
}

// ValidName checks a volume name: 1-63 characters of [a-z0-9._-],
// starting with a letter or digit.
func ValidName(field, name string) error {
	if name == "" || len(name) > 63 || strings.ContainsAny(name[:1], "._-") ||
		strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789._-") != "" {
		return errdefs.InvalidField(field, "a volume name is 1-63 characters of [a-z0-9._-], starting with a letter or digit")
	}
	return nil
}

// Create makes tenant's volume name of sizeMB MiB, empty, or with from
// set a copy of tenant's volume snapshot from (an id or a name;
// CreateFrom). ErrConflict when the name is taken or being made; nothing
// is left when it fails.
func (s *Service) Create(ctx context.Context, tenant, name string, sizeMB int64, from string) (*node.Volume, error) {
	if from != "" {
		return s.CreateFrom(ctx, tenant, name, from, sizeMB)
	}
	if sizeMB < MinSizeMB || sizeMB > MaxSizeMB {
		return nil, errdefs.InvalidField("size_mb", "must be between %d and %d MiB", MinSizeMB, MaxSizeMB)
	}
	return s.create(ctx, tenant, name, sizeMB, storage.Source{Template: scratchTemplate}, "")
}

// create makes tenant's volume name: a storage layer prepared from src
// with a quota of sizeMB MiB, owned by session when that is not "" (a
// copy that ends with it: CopyForSession).
func (s *Service) create(ctx context.Context, tenant, name string, sizeMB int64, src storage.Source, session string) (*node.Volume, error) {
	if err := ValidName("name", name); err != nil {
		return nil, err
	}
	if err := s.supported(); err != nil {
		return nil, err
	}
	release, err := s.reserve(tenant, name)
	if err != nil {
		return nil, err
	}
	defer release()
	if _, err := s.store.GetVolume(ctx, tenant, name); err == nil {
		return nil, errdefs.Newf(errdefs.ErrConflict, "volume %q already exists", name)
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	if s.quota != nil {
		release, err := s.quota(ctx, tenant, "volumes", func() (int, error) {
			rows, err := s.store.ListVolumes(ctx, tenant)
			return len(rows), err
		})
		if err != nil {
			return nil, err
		}
		defer release()
	}
	if src.Template != "" {
		if err := s.ensureScratch(ctx); err != nil {
			return nil, err
		}
	}
	id, err := layerID()
	if err != nil {
		return nil, err
	}
	// The layer first, then its record: a stop in between leaves a layer
	// no record names, which the next start's sweep removes.
	if _, err := s.storage.Prepare(ctx, id, src, sizeMB<<20); err != nil {
		return nil, fmt.Errorf("volume %q: %w", name, err)
	}
	row := store.VolumeRow{Tenant: tenant, Name: name, LayerID: id, SizeMB: sizeMB, CreatedAt: time.Now().UTC(), Session: session}
	if err := s.store.CreateVolume(ctx, row); err != nil {
		_ = s.storage.Remove(context.WithoutCancel(ctx), id)
		return nil, err
	}
	return s.view(ctx, &row), nil
}

// List returns tenant's volumes.
func (s *Service) List(ctx context.Context, tenant string) ([]*node.Volume, error) {
	rows, err := s.store.ListVolumes(ctx, tenant)
	if err != nil {
		return nil, err
	}
	out := make([]*node.Volume, 0, len(rows))
	for _, r := range rows {
		out = append(out, s.view(ctx, r))
	}
	return out, nil
}

// Get returns tenant's volume name (ErrNotFound).
func (s *Service) Get(ctx context.Context, tenant, name string) (*node.Volume, error) {
	r, err := s.store.GetVolume(ctx, tenant, name)
	if err != nil {
		return nil, err
	}
	return s.view(ctx, r), nil
}

// Remove deletes tenant's volume name and its files. ErrConflict while a
// session mounts it. Its snapshots stay (a btrfs snapshot shares the
// volume's data, not its subvolume), and volumes can still be made from
// them.
func (s *Service) Remove(ctx context.Context, tenant, name string) error {
	release, err := s.reserve(tenant, name)
	if err != nil {
		return err
	}
	defer release()
	r, err := s.store.GetVolume(ctx, tenant, name)
	if err != nil {
		return err
	}
	s.mu.Lock()
	users := s.usersLocked(r.LayerID)
	s.mu.Unlock()
	if len(users) > 0 {
		return errdefs.Newf(errdefs.ErrConflict, "volume %q is mounted by session %s", name, strings.Join(users, ", "))
	}
	// The record first: a stop before the layer is gone leaves a layer
	// the next start's sweep removes.
	if err := s.store.DeleteVolume(ctx, tenant, name); err != nil {
		return err
	}
	return s.storage.Remove(context.WithoutCancel(ctx), r.LayerID)
}

// reserve marks tenant/name busy for one create or remove at a time.
func (s *Service) reserve(tenant, name string) (func(), error) {
	key := tenant + "/" + name
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.busy[key] {
		return nil, errdefs.Newf(errdefs.ErrConflict, "volume %q is being created or removed", name)
	}
	s.busy[key] = true
	return func() {
		s.mu.Lock()
		delete(s.busy, key)
		s.mu.Unlock()
	}, nil
}

// view is r as the API shows it, with its use and mounts.
func (s *Service) view(ctx context.Context, r *store.VolumeRow) *node.Volume {
	v := &node.Volume{Name: r.Name, Tenant: r.Tenant, SizeMB: r.SizeMB, CreatedAt: r.CreatedAt, Session: r.Session}
	if used, err := s.storage.Usage(ctx, r.LayerID); err == nil {
		v.UsedBytes = used
	}
	s.mu.Lock()
	v.WriterSession = s.writer[r.LayerID]
	for id := range s.readers[r.LayerID] {
		v.ReaderSessions = append(v.ReaderSessions, id)
	}
	s.mu.Unlock()
	slices.Sort(v.ReaderSessions)
	return v
}

// usersLocked lists the sessions mounting layer id. s.mu is held.
func (s *Service) usersLocked(id string) []string {
	var out []string
	if w := s.writer[id]; w != "" {
		out = append(out, w)
	}
	for r := range s.readers[id] {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

// ensureScratch adds the empty template volumes are prepared from (once;
// adding it again with the same version does nothing).
func (s *Service) ensureScratch(ctx context.Context) error {
	dir := filepath.Join(s.dir, "volume-template")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// The volume's root is the sandbox user's, so that user can write it.
	if err := os.Chown(dir, s.shift.UID(storage.UserUID), s.shift.GID(storage.UserUID)); err != nil {
		return err
	}
	return s.storage.AddTemplate(ctx, scratchTemplate, dir, "1")
}

// layerID returns a new volume layer id.
func layerID() (string, error) {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return LayerPrefix + hex.EncodeToString(b[:]), nil
}

// mountRoots are where volumes may be mounted (the mount point below one).
var mountRoots = []string{"/home/user", "/mnt"}

// CheckMounts validates a create's volume mounts: at most MaxMounts, valid
// names, each path absolute and clean, strictly under /home/user or /mnt
// (never over a system path, since a volume is the tenant's data), no two
// at the same path or one inside another, and one volume read-write at
// most once. Errors are ErrInvalidArgument naming volumes[i].*.
func CheckMounts(ms []node.VolumeMount) error {
	if len(ms) > MaxMounts {
		return errdefs.InvalidField("volumes", "at most %d volumes", MaxMounts)
	}
	for i, m := range ms {
		f := fmt.Sprintf("volumes[%d]", i)
		if err := ValidName(f+".name", m.Name); err != nil {
			return err
		}
		p := m.Path
		if !path.IsAbs(p) || path.Clean(p) != p || strings.ContainsRune(p, 0) {
			return errdefs.InvalidField(f+".path", "must be an absolute, clean path")
		}
		under := false
		for _, root := range mountRoots {
			under = under || strings.HasPrefix(p, root+"/")
		}
		if !under {
			return errdefs.InvalidField(f+".path", "%q: a volume is mounted below /home/user or /mnt, never over a system path", p)
		}
		for j := 0; j < i; j++ {
			o := ms[j]
			if o.Path == p || strings.HasPrefix(p, o.Path+"/") || strings.HasPrefix(o.Path, p+"/") {
				return errdefs.InvalidField(f+".path", "%q overlaps volumes[%d]'s %q", p, j, o.Path)
			}
			if o.Name == m.Name && (!o.ReadOnly || !m.ReadOnly) {
				return errdefs.InvalidField(f+".name", "volume %q is mounted twice with one read-write", m.Name)
			}
		}
	}
	return nil
}
