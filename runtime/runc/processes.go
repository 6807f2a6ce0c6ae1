package runc

import (
	"bytes"
	"context"
	"errors"
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
	if !ValidID(id) {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "sandbox %q", id)
	}
	pids, err := d.cg.procs(id)
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
