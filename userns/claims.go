// Package userns gives each sandbox a host identity of its own: a slice of
// host ids that no other sandbox (of any daemon on the host) uses, a user
// namespace owned by that slice, and an id-mapped view of the sandbox's
// root filesystem.
//
// Why both. The kernel charges several per-user limits to the host uid a
// process runs as (pipe buffers past fs.pipe-user-pages-soft, epoll
// watches, file descriptors in flight over Unix sockets), so sandboxes that
// share host ids share those limits. Others are counted hierarchically per
// user namespace (inotify instances and watches, POSIX message queue bytes,
// queued signals, user namespaces): at the host's level the count belongs
// to the uid that created the namespace. runc creates a sandbox's namespace
// as host root, so every sandbox and the host's own root processes shared
// one count of fs.inotify.max_user_instances (128): one sandbox holding 128
// inotify instances made inotify_init1 fail with EMFILE in every other
// sandbox and in systemd. A namespace created by the slice's first id puts
// each sandbox in a count of its own. (kernel/ucount.c: inc_ucount and
// inc_rlimit_ucounts walk up the namespace chain, charging ns->ucounts,
// which create_user_ns takes for the creator's euid.)
//
// Files stay where they are: templates and snapshots keep the shared
// storage ids on disk (storage.DefaultIDShift), and an id-mapped mount
// (mount_setattr(2), MOUNT_ATTR_IDMAP) shows them to each sandbox shifted
// into its slice, so one copy of a template still serves every sandbox.
package userns

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/forkbox/forkbox/errdefs"
)

// SliceSize is how many host ids one slice holds: sandbox ids 0..65535,
// the range a Linux distribution's accounts live in.
const SliceSize = 65536

// DefaultRange is where slices come from: 4094 slices of 65536 ids from
// host id 1879048192 (0x70000000) up to 2147352575 (0x7FFDFFFF), the run
// systemd's "UIDs and GIDs" table leaves unused: above its container
// ranges (systemd-nspawn --private-users=pick, up to 0x6FFFFFFF) and the
// subordinate ids useradd hands out (SUB_UID_MIN..SUB_UID_MAX,
// 100000..600100000 in login.defs), below its foreign-ids range
// (0x7FFE0000) and below 2^31, which some programs still read as signed.
var DefaultRange = Range{Base: 0x70000000, Slices: 4094}

// Range is a run of slices: slice i holds host ids Base+i*SliceSize ..
// Base+(i+1)*SliceSize-1.
type Range struct {
	// Base is the first host id of slice 0.
	Base uint32
	// Slices is how many slices the range holds.
	Slices int
}

// End returns the first host id after the range.
func (r Range) End() uint64 { return uint64(r.Base) + uint64(r.Slices)*SliceSize }

// Slice is one sandbox's host ids: First..First+SliceSize-1. First is also
// the host uid and gid that own its user namespace.
type Slice struct {
	First uint32
}

// Claims hands out slices host-wide. A claim is a file in a directory that
// every daemon on the host shares, named after the slice's first id and
// created exclusively, holding the claiming daemon's owner string and the
// sandbox id. The directory should be on a tmpfs (/run): sandboxes do not
// survive a reboot, and neither do their claims. A daemon releases only its
// own claims. Claims is safe for concurrent use.
type Claims struct {
	dir   string
	rng   Range
	owner string

	mu   sync.Mutex
	mine map[string]Slice // sandbox id → slice, this owner's claims
}

// DefaultClaimsDir is the host-wide claims directory.
const DefaultClaimsDir = "/run/forkbox/id-slices"

// OpenClaims opens (creating it, 0700) the claims directory dir for slices
// of rng, on behalf of owner: the absolute path of one daemon's data
// directory, with no newline. It loads owner's existing claims (the
// sandboxes that outlived a daemon restart keep their slices) and removes
// claims whose owner directory no longer exists (a data directory that
// was deleted with sandboxes in it cannot come back for them).
func OpenClaims(dir string, rng Range, owner string) (*Claims, error) {
	if !filepath.IsAbs(owner) || strings.ContainsAny(owner, "\n") {
		return nil, fmt.Errorf("id slices: bad owner %q", owner)
	}
	if rng.Slices <= 0 || rng.End() > 1<<32-1 {
		return nil, fmt.Errorf("id slices: range %d+%d×%d does not fit in 32 bits", rng.Base, rng.Slices, SliceSize)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("id slices: %w", err)
	}
	c := &Claims{dir: dir, rng: rng, owner: owner, mine: map[string]Slice{}}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("id slices: %w", err)
	}
	for _, e := range entries {
		first, ok := c.sliceName(e.Name())
		if !ok {
			continue
		}
		path := filepath.Join(dir, e.Name())
		owner, id, err := readClaim(path)
		switch {
		case err != nil:
		case owner == c.owner:
			c.mine[id] = Slice{First: first}
		case ownerGone(owner):
			_ = os.Remove(path)
		}
	}
	return c, nil
}

// ownerGone reports whether a claim's owner directory is gone for good.
func ownerGone(owner string) bool {
	_, err := os.Stat(owner)
	return errors.Is(err, os.ErrNotExist)
}

// sliceName parses a claim file's name: the decimal first id of a slice of
// c's range.
func (c *Claims) sliceName(name string) (uint32, bool) {
	n, err := strconv.ParseUint(name, 10, 32)
	if err != nil || n < uint64(c.rng.Base) || n >= c.rng.End() || (n-uint64(c.rng.Base))%SliceSize != 0 {
		return 0, false
	}
	return uint32(n), true
}

func readClaim(path string) (owner, id string, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", "", err
	}
	lines := bytes.SplitN(b, []byte("\n"), 3)
	if len(lines) < 2 {
		return "", "", fmt.Errorf("claim %s is malformed", filepath.Base(path))
	}
	return string(lines[0]), string(lines[1]), nil
}

// Claim gives sandbox id a slice that no other sandbox on the host holds;
// claiming again for the same id returns the slice it has. ErrUnavailable
// when every slice of the range is taken.
func (c *Claims) Claim(id string) (Slice, error) {
	if id == "" || strings.ContainsAny(id, "\n/") {
		return Slice{}, errdefs.InvalidField("id", "not a sandbox id")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.mine[id]; ok {
		return s, nil
	}
	// The claim is written whole under a temporary name and linked into
	// place: link(2) fails if the name exists, and a crash never leaves a
	// claim without its owner.
	tmp, err := os.CreateTemp(c.dir, ".claim-")
	if err != nil {
		return Slice{}, fmt.Errorf("claim id slice: %w", err)
	}
	defer os.Remove(tmp.Name())
	_, werr := tmp.WriteString(c.owner + "\n" + id + "\n")
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return Slice{}, fmt.Errorf("claim id slice: %w", werr)
	}
	// The lowest free slice: the slices in use stay few, so the id maps
	// of id-mapped mounts are reused (MapMount keeps them).
	for i := 0; i < c.rng.Slices; i++ {
		first := c.rng.Base + uint32(i)*SliceSize
		path := filepath.Join(c.dir, strconv.FormatUint(uint64(first), 10))
		err := os.Link(tmp.Name(), path)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return Slice{}, fmt.Errorf("claim id slice: %w", err)
		}
		s := Slice{First: first}
		c.mine[id] = s
		return s, nil
	}
	return Slice{}, errdefs.Newf(errdefs.ErrUnavailable, "all %d host id slices are in use", c.rng.Slices)
}

// Lookup returns sandbox id's slice, if it has one.
func (c *Claims) Lookup(id string) (Slice, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.mine[id]
	return s, ok
}

// Release gives sandbox id's slice back. Releasing an id without a slice
// is not an error. The claim file is removed only if it is still this
// owner's claim for id.
func (c *Claims) Release(id string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.mine[id]
	if !ok {
		return nil
	}
	path := filepath.Join(c.dir, strconv.FormatUint(uint64(s.First), 10))
	owner, claimed, err := readClaim(path)
	if err == nil && owner == c.owner && claimed == id {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("release id slice: %w", err)
		}
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("release id slice: %w", err)
	}
	delete(c.mine, id)
	return nil
}

// Sweep releases this owner's claims whose sandbox live reports false
// (sandboxes that ended while the daemon was down, or creates cut short by
// a crash).
func (c *Claims) Sweep(live func(id string) bool) error {
	c.mu.Lock()
	var dead []string
	for id := range c.mine {
		if !live(id) {
			dead = append(dead, id)
		}
	}
	c.mu.Unlock()
	var errs []error
	for _, id := range dead {
		errs = append(errs, c.Release(id))
	}
	return errors.Join(errs...)
}
