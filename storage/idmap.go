package storage

// IDShift maps sandbox ids to host ids: sandbox uid u is host uid UIDBase+u
// for u < Size (the same for gids). Every sandbox uses the same shift, so a
// template's files, owned by shifted ids on the host, look right inside all
// of them.
type IDShift struct {
	UIDBase, GIDBase, Size uint32
}

// DefaultIDShift maps sandbox ids 0..65535 to host ids 100000..165535: root
// in a sandbox is an unprivileged nobody on the host.
var DefaultIDShift = IDShift{UIDBase: 100000, GIDBase: 100000, Size: 65536}

// UID returns the host uid of sandbox uid u.
func (s IDShift) UID(u uint32) int { return int(s.UIDBase + u) }

// GID returns the host gid of sandbox gid g.
func (s IDShift) GID(g uint32) int { return int(s.GIDBase + g) }

// Sandbox ids of the two standard accounts.
const (
	RootUID = 0
	UserUID = 1000
)
