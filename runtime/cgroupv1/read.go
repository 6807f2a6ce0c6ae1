package cgroupv1

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/runtime"
)

// Stats reads sandbox id's resource use from its cgroups: cpuacct.usage,
// memory.usage_in_bytes, memory.max_usage_in_bytes, pids.current, the
// oom_kill counter and, where the kernel keeps it, the "max" count of
// pids.events. ErrNotFound when the id is invalid or the sandbox has no
// cgroup.
func (c *Cgroups) Stats(id string) (runtime.Stats, error) {
	st, err := c.cpu(id)
	if err != nil {
		return st, err
	}
	if st.MemoryBytes, err = c.readInt("memory", id, "memory.usage_in_bytes"); err != nil {
		return st, err
	}
	if st.MemoryPeakBytes, err = c.readInt("memory", id, "memory.max_usage_in_bytes"); err != nil {
		return st, err
	}
	if st.Pids, err = c.readInt("pids", id, "pids.current"); err != nil {
		return st, err
	}
	if st.OOMKills, err = c.oomKills(id); err != nil {
		return st, err
	}
	st.PidsLimitHits, _ = c.pidsLimitHits(id) // (older kernels have no pids.events)
	st.ReadAt = time.Now()
	return st, nil
}

// cpu starts a reading of sandbox id with its CPU time (cpuacct.usage),
// the read both Stats and Sample begin with. ErrNotFound when the id is
// invalid or the sandbox has no cgroup.
func (c *Cgroups) cpu(id string) (runtime.Stats, error) {
	var st runtime.Stats
	if !runtime.ValidID(id) {
		return st, errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	cpuNS, err := c.readInt("cpuacct", id, "cpuacct.usage")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return st, errdefs.Newf(errdefs.ErrNotFound, "cgroup of sandbox %q", id)
		}
		return st, err
	}
	st.CPUSeconds = float64(cpuNS) / 1e9
	return st, nil
}

// Sample is the host monitor's reading of sandbox id from its cgroups
// (see runtime.Sampler): cpuacct.usage, pids.current, pids.max, the
// "max" count of pids.events and memory.usage_in_bytes (the history E2B's
// getMetrics reads), five small reads and no process started. PidsLimit
// is 0 when pids.max is "max". ErrNotFound when the id is invalid or the
// sandbox has no cgroup.
func (c *Cgroups) Sample(id string) (runtime.Stats, error) {
	st, err := c.cpu(id)
	if err != nil {
		return st, err
	}
	if st.Pids, err = c.readInt("pids", id, "pids.current"); err != nil {
		return st, err
	}
	st.PidsLimit, _ = c.readInt("pids", id, "pids.max") // "max" (no limit) reads as 0
	st.PidsLimitHits, _ = c.pidsLimitHits(id)           // (older kernels have no pids.events)
	st.MemoryBytes, _ = c.readInt("memory", id, "memory.usage_in_bytes")
	st.ReadAt = time.Now()
	return st, nil
}

// Procs returns the host pids of every process in sandbox id's pids
// cgroup (cgroup.procs). An error wrapping os.ErrNotExist when the
// sandbox has no cgroup.
func (c *Cgroups) Procs(id string) ([]int, error) {
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

// PidsLimitHits returns how many tasks the pids limit of sandbox id's
// host cgroup has refused (the "max" count of its pids.events). An error
// when the id is invalid, the cgroup is gone or the kernel keeps no such
// count.
func (c *Cgroups) PidsLimitHits(id string) (int64, error) {
	if !runtime.ValidID(id) {
		return 0, fmt.Errorf("invalid sandbox id %q", id)
	}
	return c.pidsLimitHits(id)
}

// OOMKills returns the oom_kill count of sandbox id's host memory cgroup
// (processes the kernel killed at its memory limit). An error when the id
// is invalid or the cgroup is gone.
func (c *Cgroups) OOMKills(id string) (int64, error) {
	if !runtime.ValidID(id) {
		return 0, fmt.Errorf("invalid sandbox id %q", id)
	}
	return c.oomKills(id)
}

// readInt reads a cgroup file that holds one decimal integer.
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
	return c.readKey("memory", id, "memory.oom_control", "oom_kill ")
}

// pidsLimitHits reads the "max" count of the sandbox's pids.events: forks
// refused at its pids limit.
func (c *Cgroups) pidsLimitHits(id string) (int64, error) {
	return c.readKey("pids", id, "pids.events", "max ")
}

// readKey reads the integer after prefix on a line of a flat-keyed cgroup
// file; 0 when no line has the prefix.
func (c *Cgroups) readKey(controller, id, file, prefix string) (int64, error) {
	p, err := c.path(controller, id)
	if err != nil {
		return 0, err
	}
	b, err := os.ReadFile(filepath.Join(p, file))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, prefix); ok {
			return strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, nil
}
