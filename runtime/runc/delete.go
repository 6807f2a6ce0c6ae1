package runc

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/forkbox/forkbox/runtime"
)

// runcState is the part of runc's state.json (libcontainer's State, runc
// 1.1) that deleteStopped reads.
type runcState struct {
	InitPID     int               `json:"init_process_pid"`
	InitStart   uint64            `json:"init_process_start"`
	CgroupPaths map[string]string `json:"cgroup_paths"`
}

// errNotStopped: deleteStopped found something still there that `runc
// delete` must handle.
var errNotStopped = errors.New("not provably stopped")

// deleteStopped removes what `runc delete` removes for a stopped
// container, without starting the runc CLI: the container's cgroup
// directories and its state directory under StateRoot. forkbox gives runc
// no hooks and no Intel RDT settings, so that is everything runc's own
// destroy would do for it. It acts only when the container is provably
// stopped: its init process (pid and start time from state.json) is gone
// and every cgroup runc recorded is gone after RemoveDirs. Otherwise it
// returns errNotStopped and changes nothing but the empty cgroups, and
// the caller asks runc. No state directory: the cgroups go, nil.
func (d *Driver) deleteStopped(id string) error {
	if !runtime.ValidID(id) {
		return nil
	}
	dir := filepath.Join(d.runc.Root, id)
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Lstat(dir); errors.Is(serr, os.ErrNotExist) {
			// runc knows nothing of it (a `runc run` killed half-way):
			// the cgroups it may have made still go.
			if err := d.cg.RemoveDirs(id); err != nil {
				return fmt.Errorf("remove cgroups of %s: %w", id, err)
			}
			return nil
		}
		return errNotStopped // (being made or half removed: runc decides)
	}
	if err != nil {
		return err
	}
	var st runcState
	if err := json.Unmarshal(b, &st); err != nil || st.InitPID <= 0 {
		return errNotStopped
	}
	if alive(st.InitPID, st.InitStart) {
		return errNotStopped
	}
	if err := d.cg.RemoveDirs(id); err != nil {
		return fmt.Errorf("remove cgroups of %s: %w", id, err)
	}
	for _, p := range st.CgroupPaths {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			return errNotStopped
		}
	}
	return os.RemoveAll(dir)
}

// alive reports whether process pid runs and started at start (clock
// ticks since boot, field 22 of /proc/pid/stat), i.e. was not replaced by
// another process with a reused pid. Unreadable: true (the caller then
// does not assume it gone).
func alive(pid int, start uint64) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return false
	}
	if err != nil {
		return true
	}
	// The command (field 2) is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return true
	}
	fields := strings.Fields(string(b[i+1:]))
	if len(fields) < 20 {
		return true
	}
	if fields[0] == "Z" || fields[0] == "X" { // exited, not yet reaped
		return false
	}
	got, err := strconv.ParseUint(fields[19], 10, 64)
	return err != nil || got == start
}
