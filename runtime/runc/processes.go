package runc

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/runtime"
)

// maxCmdline bounds the command line read per process, in bytes.
const maxCmdline = 4 << 10

// Processes lists the sandbox's processes from the host: the pids of its
// cgroup, with each one's comm and command line from /proc. A process
// that ends meanwhile is skipped. ErrNotFound for an unknown sandbox.
func (d *Driver) Processes(ctx context.Context, id string) ([]runtime.Process, error) {
	if !runtime.ValidID(id) {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	pids, err := d.cg.Procs(id)
	if errors.Is(err, os.ErrNotExist) {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "cgroup of sandbox %q", id)
	}
	if err != nil {
		return nil, err
	}
	out := make([]runtime.Process, 0, len(pids))
	for _, pid := range pids {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		dir := "/proc/" + strconv.Itoa(pid)
		comm, err := os.ReadFile(dir + "/comm")
		if err != nil {
			continue
		}
		p := runtime.Process{Pid: pid, Name: strings.TrimSpace(string(comm))}
		if f, err := os.Open(dir + "/cmdline"); err == nil {
			buf := make([]byte, maxCmdline)
			n, _ := f.Read(buf)
			f.Close()
			p.Cmdline = strings.TrimSpace(string(bytes.ReplaceAll(buf[:n], []byte{0}, []byte{' '})))
		}
		out = append(out, p)
	}
	return out, nil
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
