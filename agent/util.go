package agent

import (
	"os"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/internal/envdpb/processpb"
)

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// resizePTY sets the terminal size of PTY master to sz (columns and
// rows). The ioctl goes through the file's raw descriptor without
// (*os.File).Fd, which would put the master in blocking mode, where a read
// deadline no longer ends a read.
func resizePTY(master *os.File, sz *processpb.PTY_Size) error {
	ws := &unix.Winsize{Col: uint16(sz.GetCols()), Row: uint16(sz.GetRows())}
	return rawControl(master, func(fd int) error { return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, ws) })
}

// pollPTY puts a PTY master back into non-blocking mode, so that reads
// wait in the runtime's poller and honour read deadlines (the drain after
// a process exits relies on them). creack/pty's Open leaves the master
// blocking: it calls (*os.File).Fd for its ioctls. Without this, a read
// blocked while a background process that left the session kept the
// terminal open, and the command's stream did not end (seen under load).
func pollPTY(master *os.File) error {
	return rawControl(master, func(fd int) error { return unix.SetNonblock(fd, true) })
}

// rawControl runs op on f's descriptor through SyscallConn and returns
// op's error or the one of reaching the descriptor.
func rawControl(f *os.File, op func(fd int) error) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var opErr error
	if err := sc.Control(func(fd uintptr) { opErr = op(int(fd)) }); err != nil {
		return err
	}
	return opErr
}
