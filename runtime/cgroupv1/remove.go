package cgroupv1

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/forkbox/forkbox/runtime"
)

// Kill SIGKILLs every process in sandbox id's cgroup and waits (up to 10
// s, or ctx) until none is left; a frozen cgroup is thawed after the
// signals, so that they are delivered. A missing cgroup means nothing
// runs: nil. An error when processes survive the 10 s.
func (c *Cgroups) Kill(ctx context.Context, id string) error {
	frozen := false
	if st, err := c.FreezerState(id); err == nil && st != Thawed {
		frozen = true
	}
	deadline := time.Now().Add(10 * time.Second)
	for delay := 200 * time.Microsecond; ; delay = min(delay*2, 20*time.Millisecond) {
		pids, err := c.Procs(id)
		if errors.Is(err, os.ErrNotExist) || err == nil && len(pids) == 0 {
			return nil
		}
		if err != nil {
			return fmt.Errorf("list processes of %s: %w", id, err)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if frozen {
			_ = c.SetFreezer(id, Thawed)
			frozen = false
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox %s: %d processes survived SIGKILL", id, len(pids))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// RemoveDirs deletes sandbox id's cgroup directories in every hierarchy,
// under c's parent and under LegacyParent (a runtime removes only what it
// has state for: a leftover directory would pin its limits forever).
// Directories that are already gone are fine; one that still holds a
// process is an error (EBUSY).
func (c *Cgroups) RemoveDirs(id string) error {
	if !runtime.ValidID(id) {
		return nil
	}
	if err := c.loadMounts(); err != nil {
		return err
	}
	var errs []error
	seen := map[string]bool{}
	for _, mp := range c.mounts {
		if seen[mp] {
			continue
		}
		seen[mp] = true
		for _, parent := range []string{c.parent, LegacyParent} {
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

// Remove SIGKILLs every process left in sandbox id's cgroups, waits until
// they are gone (Kill) and removes the cgroup directories (RemoveDirs).
// For drivers after their runtime's own delete (gVisor) and for forkbox
// down: a runtime whose state was lost must not leave its processes
// running. An invalid id is nothing to remove.
func (c *Cgroups) Remove(ctx context.Context, id string) error {
	if !runtime.ValidID(id) {
		return nil
	}
	if err := c.Kill(ctx, id); err != nil {
		return err
	}
	return c.RemoveDirs(id)
}

// Sandboxes lists the ids of the sandbox cgroups under c's own parent, in
// any hierarchy (forkbox down kills what is left there). Entries that are
// not valid sandbox ids are skipped.
func (c *Cgroups) Sandboxes() ([]string, error) {
	if err := c.loadMounts(); err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var ids []string
	for _, mp := range c.mounts {
		entries, err := os.ReadDir(filepath.Join(mp, c.parent))
		if err != nil {
			continue
		}
		for _, e := range entries {
			if e.IsDir() && runtime.ValidID(e.Name()) && !seen[e.Name()] {
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
	if err := c.loadMounts(); err != nil {
		return err
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
