package runc

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/runtime"
)

// LegacyCgroupParent is the cgroup under which every daemon made its
// sandboxes' cgroups before each had its own parent
// (datadir.HostNames.CgroupParent); Cgroups still finds sandboxes there.
const LegacyCgroupParent = "forkbox"

// Cgroups reads and writes sandboxes' cgroup v1 files directly, which is
// an order of magnitude faster than a runc CLI call (no process start).
// A sandbox's cgroup is PARENT/ID in every hierarchy; a sandbox made by a
// daemon of a previous version (under LegacyCgroupParent) is found there
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

// NewCgroups returns the cgroups of the sandboxes under parent (a cgroup
// name; "" is LegacyCgroupParent).
func NewCgroups(parent string) *Cgroups {
	if parent == "" {
		parent = LegacyCgroupParent
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
	for _, parent := range []string{c.parent, LegacyCgroupParent} {
		if _, err := os.Stat(filepath.Join(mp, parent, id)); err == nil {
			c.where.Store(id, parent)
			return parent
		}
	}
	return c.parent
}

// mountPoint returns where the v1 hierarchy holding controller is mounted.
func (c *Cgroups) mountPoint(controller string) (string, error) {
	c.once.Do(func() { c.mounts, c.err = readCgroupMounts() })
	if c.err != nil {
		return "", c.err
	}
	mp, ok := c.mounts[controller]
	if !ok {
		return "", fmt.Errorf("cgroup v1 controller %q is not mounted", controller)
	}
	return mp, nil
}

// path returns the sandbox's directory in controller's hierarchy.
func (c *Cgroups) path(controller, id string) (string, error) {
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

func (c *Cgroups) readInt(controller, id, file string) (int64, error) {
	p, err := c.path(controller, id)
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(filepath.Join(p, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}

// oomKills returns the oom_kill counter of memory.oom_control.
func (c *Cgroups) oomKills(id string) (int64, error) {
	p, err := c.path("memory", id)
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(filepath.Join(p, "memory.oom_control"))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, nil
}

// procs returns the host pids of every process in the sandbox's cgroup.
func (c *Cgroups) procs(id string) ([]int, error) {
	p, err := c.path("pids", id)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if n, err := strconv.Atoi(f); err == nil {
			pids = append(pids, n)
		}
	}
	return pids, nil
}

// freezerState returns THAWED, FREEZING or FROZEN.
func (c *Cgroups) freezerState(id string) (string, error) {
	p, err := c.path("freezer", id)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(p, "freezer.state"))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// setFreezer writes state (FROZEN or THAWED) and waits until the kernel
// reports it, polling with a short backoff; it gives up after 2 s.
func (c *Cgroups) setFreezer(id, state string) error {
	p, err := c.path("freezer", id)
	if err != nil {
		return err
	}
	file := filepath.Join(p, "freezer.state")
	deadline := time.Now().Add(2 * time.Second)
	for delay := 50 * time.Microsecond; ; delay = min(delay*2, 10*time.Millisecond) {
		if err := os.WriteFile(file, []byte(state), 0); err != nil {
			return err
		}
		got, err := c.freezerState(id)
		if err != nil {
			return err
		}
		if got == state {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("freezer of %s stuck in %s, wanted %s", id, got, state)
		}
		time.Sleep(delay)
	}
}

// remove deletes the sandbox's cgroup directories in every hierarchy.
// Directories that are already gone are fine.
func (c *Cgroups) remove(id string) error {
	c.once.Do(func() { c.mounts, c.err = readCgroupMounts() })
	if c.err != nil {
		return c.err
	}
	var errs []error
	seen := map[string]bool{}
	for _, mp := range c.mounts {
		if seen[mp] {
			continue
		}
		seen[mp] = true
		for _, parent := range []string{c.parent, LegacyCgroupParent} {
			dir := filepath.Join(mp, parent, id)
			if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) == 0 {
		c.where.Delete(id)
	}
	return errors.Join(errs...)
}

// Sandboxes lists the ids of the sandbox cgroups under c's own parent, in
// any hierarchy (forkbox down kills what is left there).
func (c *Cgroups) Sandboxes() ([]string, error) {
	c.once.Do(func() { c.mounts, c.err = readCgroupMounts() })
	if c.err != nil {
		return nil, c.err
	}
	seen := map[string]bool{}
	var ids []string
	for _, mp := range c.mounts {
		entries, err := os.ReadDir(filepath.Join(mp, c.parent))
		if err != nil {
			continue
		}
		for _, e := range entries {
			if e.IsDir() && ValidID(e.Name()) && !seen[e.Name()] {
				seen[e.Name()] = true
				ids = append(ids, e.Name())
			}
		}
	}
	return ids, nil
}

// RemoveParent removes c's parent cgroup in every hierarchy when no
// sandbox is left under it (forkbox down); a parent that is gone, or
// still holds a sandbox, is left as it is (EBUSY) and not an error.
func (c *Cgroups) RemoveParent() error {
	c.once.Do(func() { c.mounts, c.err = readCgroupMounts() })
	if c.err != nil {
		return c.err
	}
	var errs []error
	seen := map[string]bool{}
	for _, mp := range c.mounts {
		if seen[mp] {
			continue
		}
		seen[mp] = true
		err := os.Remove(filepath.Join(mp, c.parent))
		if err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.EBUSY) && !errors.Is(err, syscall.ENOTEMPTY) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Remove SIGKILLs every process left in sandbox id's cgroups, waits until
// they are gone (up to 10 s, or ctx) and removes the cgroup directories.
// For other drivers that use the same cgroup layout (gVisor), after their
// own delete: a runtime whose state was lost must not leave its processes
// running.
func (c *Cgroups) Remove(ctx context.Context, id string) error {
	if !ValidID(id) {
		return nil
	}
	if err := killCgroup(ctx, c, id); err != nil {
		return err
	}
	return c.remove(id)
}

// sample reads what the host monitor needs of the sandbox's cgroups:
// cpuacct.usage, pids.current, pids.max and the "max" count of
// pids.events: four small reads, no process started.
func (c *Cgroups) sample(id string) (runtime.Stats, error) {
	var st runtime.Stats
	cpuNS, err := c.readInt("cpuacct", id, "cpuacct.usage")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return st, errdefs.Newf(errdefs.ErrNotFound, "cgroup of sandbox %q", id)
		}
		return st, err
	}
	st.CPUSeconds = float64(cpuNS) / 1e9
	if st.Pids, err = c.readInt("pids", id, "pids.current"); err != nil {
		return st, err
	}
	st.PidsLimit, _ = c.readInt("pids", id, "pids.max") // "max" (no limit) reads as 0
	st.PidsLimitHits, _ = c.pidsLimitHits(id)           // (older kernels have no pids.events)
	st.ReadAt = time.Now()
	return st, nil
}

// Sample is the host monitor's reading of sandbox id from its cgroups
// (see runtime.Sampler), for other drivers that use the same cgroup
// layout (gVisor). ErrNotFound when the sandbox has no cgroup.
func (c *Cgroups) Sample(id string) (runtime.Stats, error) {
	if !ValidID(id) {
		return runtime.Stats{}, errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	return c.sample(id)
}

// PidsLimitHits returns how many tasks the pids limit of sandbox id's
// host cgroup has refused (the "max" count of its pids.events), for
// drivers other than runc whose sandboxes live in the same cgroups (the
// gVisor driver). An error when the cgroup is gone or the kernel keeps no
// such count.
func (c *Cgroups) PidsLimitHits(id string) (int64, error) {
	if !ValidID(id) {
		return 0, fmt.Errorf("invalid sandbox id %q", id)
	}
	return c.pidsLimitHits(id)
}

// OOMKills returns the oom_kill count of sandbox id's host memory cgroup
// (processes the kernel killed at its memory limit), for drivers other
// than runc whose sandboxes live in the same cgroups.
func (c *Cgroups) OOMKills(id string) (int64, error) {
	if !ValidID(id) {
		return 0, fmt.Errorf("invalid sandbox id %q", id)
	}
	return c.oomKills(id)
}

// nsPgid returns the innermost-namespace process group id of host pid, read
// from the NSpgid line of /proc/<pid>/status.
func nsPgid(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "NSpgid:"); ok {
			f := strings.Fields(v)
			if len(f) == 0 {
				break
			}
			return strconv.Atoi(f[len(f)-1])
		}
	}
	return 0, fmt.Errorf("pid %d: no NSpgid in status", pid)
}

// pidsLimitHits reads the "max" count of the sandbox's pids.events: forks
// refused at its pids limit.
func (c *Cgroups) pidsLimitHits(id string) (int64, error) {
	p, err := c.path("pids", id)
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(filepath.Join(p, "pids.events"))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "max "); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, nil
}
