package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// scrubEnviron overwrites with zeros, in the agent's own memory, the
// environment strings env that the kernel put at the top of its initial
// stack at start: that is what /proc/PID/environ shows. The runc tier's
// kernel hides it from other users (the agent is not dumpable), but gVisor
// shows every process's environ to every process of the sandbox (its
// procfs checks no access), and the agent's held its start-up
// configuration. The Go runtime works on its own copy of the environment,
// so nothing reads these bytes afterwards.
//
// It reads and writes its own memory with process_vm_readv/writev
// (gVisor's /proc/self/mem is read-only). It returns an error when a
// string was not found, and does nothing for an empty env.
func scrubEnviron(env []string) error {
	if len(env) == 0 {
		return nil
	}
	lo, hi, err := stackMapping()
	if err != nil {
		return err
	}
	// The strings sit in the stack's top pages (argv, environment, the
	// executable's name); read a little more than they take.
	size := 64 << 10
	for _, s := range env {
		size += 2 * (len(s) + 1)
	}
	start := lo
	if hi-lo > uint64(size) {
		start = hi - uint64(size)
	}
	top := make([]byte, hi-start)
	if _, err := unix.ProcessVMReadv(os.Getpid(), []unix.Iovec{{Base: &top[0], Len: uint64(len(top))}},
		[]unix.RemoteIovec{{Base: uintptr(start), Len: len(top)}}, 0); err != nil {
		return fmt.Errorf("read the initial stack: %w", err)
	}
	var missing []string
	for _, s := range env {
		// Each string is NUL-terminated and follows another one's NUL.
		pat := []byte("\x00" + s + "\x00")
		found := false
		for off := 0; ; {
			i := bytes.Index(top[off:], pat)
			if i < 0 {
				break
			}
			at := off + i + 1
			zero := make([]byte, len(s))
			if _, err := unix.ProcessVMWritev(os.Getpid(), []unix.Iovec{{Base: &zero[0], Len: uint64(len(zero))}},
				[]unix.RemoteIovec{{Base: uintptr(start) + uintptr(at), Len: len(zero)}}, 0); err != nil {
				return fmt.Errorf("clear the initial environment: %w", err)
			}
			copy(top[at:], zero)
			found = true
			off = at + len(s)
		}
		if !found && s != "" {
			missing = append(missing, strings.SplitN(s, "=", 2)[0])
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("environment strings not found in the initial stack: %s", strings.Join(missing, ", "))
	}
	return nil
}

// stackMapping returns the address range of the process's initial stack
// ([stack] in /proc/self/maps).
func stackMapping() (lo, hi uint64, err error) {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasSuffix(line, "[stack]") {
			continue
		}
		r, _, _ := strings.Cut(line, " ")
		a, b, ok := strings.Cut(r, "-")
		if !ok {
			break
		}
		if lo, err = strconv.ParseUint(a, 16, 64); err == nil {
			hi, err = strconv.ParseUint(b, 16, 64)
		}
		if err != nil || hi <= lo {
			return 0, 0, fmt.Errorf("bad [stack] line %q", line)
		}
		return lo, hi, nil
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	return 0, 0, errors.New("no [stack] mapping in /proc/self/maps")
}
