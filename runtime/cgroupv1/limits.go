package cgroupv1

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/runtime"
)

// CPUPeriodUS is the CFS period sandboxes' CPU quotas are expressed in,
// in µs (the OCI spec's default, which runtime/ocispec uses too).
const CPUPeriodUS = 100000

// SetLimits writes limits into sandbox id's cgroups: the CPU quota
// (l.CPU cores over CPUPeriodUS), the memory limit with memory+swap equal
// to it (no swap), and the pids limit, as the OCI runtimes write them at
// a start. The memory pair is written in the order the kernel accepts
// (memsw is never below memory). All of l's fields must be positive.
// ErrNotFound for an unknown sandbox; the kernel's error otherwise (a
// memory limit below what the sandbox uses now is EBUSY).
func (c *Cgroups) SetLimits(id string, l runtime.Limits) error {
	if !runtime.ValidID(id) {
		return errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	if l.CPU <= 0 || l.MemoryBytes <= 0 || l.Pids <= 0 {
		return fmt.Errorf("limits must all be positive, got %+v", l)
	}
	write := func(controller, file string, v int64) error {
		p, err := c.path(controller, id)
		if err != nil {
			return err
		}
		err = os.WriteFile(filepath.Join(p, file), []byte(strconv.FormatInt(v, 10)), 0)
		if errors.Is(err, os.ErrNotExist) {
			return errdefs.Newf(errdefs.ErrNotFound, "cgroup of sandbox %q", id)
		}
		return err
	}
	if err := write("cpu", "cpu.cfs_period_us", CPUPeriodUS); err != nil {
		return err
	}
	if err := write("cpu", "cpu.cfs_quota_us", int64(l.CPU*CPUPeriodUS)); err != nil {
		return err
	}
	cur, err := c.readInt("memory", id, "memory.limit_in_bytes")
	if errors.Is(err, os.ErrNotExist) {
		return errdefs.Newf(errdefs.ErrNotFound, "cgroup of sandbox %q", id)
	}
	if err != nil {
		return err
	}
	order := []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"}
	if l.MemoryBytes > cur {
		order[0], order[1] = order[1], order[0] // raise memsw first
	}
	for _, f := range order {
		if err := write("memory", f, l.MemoryBytes); err != nil {
			return err
		}
	}
	return write("pids", "pids.max", l.Pids)
}
