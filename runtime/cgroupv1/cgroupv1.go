// Package cgroupv1 reads and writes the cgroup v1 files of sandboxes
// directly: resource readings, the freezer, out-of-band kills and the
// removal of what a runtime left. Both OCI drivers (runc and runsc) put a
// sandbox's cgroup at PARENT/ID in every hierarchy, and both use this
// package for what they do there without a runtime CLI call (which costs
// a process start each time).
package cgroupv1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/forkbox/forkbox/runtime"
)

// LegacyParent is the cgroup under which every daemon made its
// sandboxes' cgroups before each had its own parent
// (storage.HostNames.CgroupParent); Cgroups still finds sandboxes there.
const LegacyParent = "forkbox"

// Cgroups reads and writes sandboxes' cgroup v1 files directly, which is
// an order of magnitude faster than a runc CLI call (no process start).
// A sandbox's cgroup is PARENT/ID in every hierarchy; a sandbox made by a
// daemon of a previous version (under LegacyParent) is found there
// and removed from there, so that it can be adopted. Safe for concurrent
// use.
type Cgroups struct {
	parent string
	once   sync.Once
	mounts map[string]string // controller name -> hierarchy mount point
	err    error
	// where remembers, per sandbox id, the parent its cgroups were
	// found under (its own, or the legacy one).
	where sync.Map
}

// New returns the cgroups of the sandboxes under parent (a cgroup name,
// relative to each hierarchy's root; "" is LegacyParent). Nothing is read
// until the first call that needs the hierarchies' mount points.
func New(parent string) *Cgroups {
	if parent == "" {
		parent = LegacyParent
	}
	return &Cgroups{parent: parent}
}

// SpecPath is sandbox id's cgroup path for its OCI spec (relative to each
// hierarchy's root): /PARENT/ID.
func (c *Cgroups) SpecPath(id string) string { return "/" + c.parent + "/" + id }

// parentOf returns the parent under which sandbox id's cgroup is in the
// hierarchy mounted at mp: c's own, or the legacy one for a sandbox made
// by a previous version; c's own when it is in neither (yet).
func (c *Cgroups) parentOf(mp, id string) string {
	if v, ok := c.where.Load(id); ok {
		return v.(string)
	}
	for _, parent := range []string{c.parent, LegacyParent} {
		if _, err := os.Stat(filepath.Join(mp, parent, id)); err == nil {
			c.where.Store(id, parent)
			return parent
		}
	}
	return c.parent
}

// loadMounts reads the hierarchies' mount points once.
func (c *Cgroups) loadMounts() error {
	c.once.Do(func() { c.mounts, c.err = readCgroupMounts() })
	return c.err
}

// mountPoint returns where the v1 hierarchy holding controller is mounted.
func (c *Cgroups) mountPoint(controller string) (string, error) {
	if err := c.loadMounts(); err != nil {
		return "", err
	}
	mp, ok := c.mounts[controller]
	if !ok {
		return "", fmt.Errorf("cgroup v1 controller %q is not mounted", controller)
	}
	return mp, nil
}

// path returns the sandbox's directory in controller's hierarchy; an
// error for an id that is not a valid sandbox id (it is a path
// component).
func (c *Cgroups) path(controller, id string) (string, error) {
	if !runtime.ValidID(id) {
		return "", fmt.Errorf("invalid sandbox id %q", id)
	}
	mp, err := c.mountPoint(controller)
	if err != nil {
		return "", err
	}
	return filepath.Join(mp, c.parentOf(mp, id), id), nil
}

// unifiedKey is the key of the cgroup2 ("unified") mount in the map of
// readCgroupMounts. On a hybrid host runc makes the sandbox's cgroup there
// too; remove must find it (runc delete only removes what runc has state
// for: after a runc run killed half-way the directory would stay forever).
const unifiedKey = "cgroup2"

// readCgroupMounts parses /proc/self/mountinfo for cgroup (v1) mounts.
func readCgroupMounts() (map[string]string, error) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return parseCgroupMounts(data)
}

// parseCgroupMounts maps each v1 controller (and the unified hierarchy, as
// unifiedKey) to its mount point, from mountinfo data.
func parseCgroupMounts(data []byte) (map[string]string, error) {
	out := map[string]string{}
	unified := ""
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		// id parent major:minor root mountpoint opts ... - fstype source superopts
		fields := strings.Fields(sc.Text())
		sep := -1
		for i, f := range fields {
			if f == "-" {
				sep = i
				break
			}
		}
		if sep >= 0 && len(fields) > sep+1 && fields[sep+1] == "cgroup2" && unified == "" {
			unified = fields[4]
		}
		if sep < 0 || len(fields) < sep+4 || fields[sep+1] != "cgroup" {
			continue
		}
		for _, opt := range strings.Split(fields[sep+3], ",") {
			if _, seen := out[opt]; !seen {
				out[opt] = fields[4]
			}
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no cgroup v1 hierarchy is mounted")
	}
	if unified != "" {
		out[unifiedKey] = unified
	}
	return out, nil
}
