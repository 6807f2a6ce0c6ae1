package interp

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// kernelStartTimeout bounds a kernel's start (an IPython kernel imports
// for a second or two; far longer in gVisor under load).
const kernelStartTimeout = 120 * time.Second

// interruptGrace is how long an interrupted cell may take to end before
// its interpreter is killed (and restarted by the next call).
const interruptGrace = 10 * time.Second

// cell is one execution request.
type cell struct {
	code string
	env  map[string]string
	// session is the session's environment (Launcher.Env), which a
	// Python kernel applies when it changed.
	session map[string]string
}

// kernel is one context's interpreter.
type kernel interface {
	// run executes c and passes each output line (E2B's line types,
	// without end_of_execution) to emit; it returns when the cell has
	// ended. Closing interrupt asks the cell to stop: the interpreter is
	// interrupted, and killed when it does not stop within
	// interruptGrace. emit's errors (a client gone) do not stop the cell.
	run(c cell, interrupt <-chan struct{}, emit func([]byte))
	// dead reports whether the interpreter has exited (the next call
	// starts a new one).
	dead() bool
	// close kills the interpreter and what it started.
	close()
	// abort kills the interpreter now; unlike the others it may be
	// called while run runs (from another goroutine), which then ends
	// with the interpreter's death.
	abort()
}

// pythonKernel is an IPython kernel behind the Python bridge (bridge.py),
// which speaks JSON lines on its stdin and stdout.
type pythonKernel struct {
	p     *process
	lines chan []byte // the bridge's lines; closed at its end
	cells int         // the id of the last cell sent
	// broken is set once the kernel is known dead (the bridge said so, or
	// it was killed): the next call starts a new one.
	broken bool
	// kernelPID is the kernel's pid, which leads a session of its own
	// (jupyter_client starts it so, to interrupt it as a group).
	kernelPID int
}

// startPython starts the bridge for a context in dir, and waits until its
// kernel is ready (or failed, or kernelStartTimeout passed).
func startPython(l Launcher, dir string) (kernel, error) {
	argv := []string{"python3", "-I", "-c", BridgeSource, dir, ChartsSource}
	env := map[string]string{"PYDEVD_DISABLE_FILE_VALIDATION": "1", "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
	p, outs, err := start(l, argv, env, dir, []int{1, 2})
	if err != nil {
		return nil, fmt.Errorf("start python3: %w", err)
	}
	go drain(outs[1])
	k := &pythonKernel{p: p, lines: make(chan []byte, 1)}
	go k.read(outs[0])
	timer := time.NewTimer(kernelStartTimeout)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-k.lines:
			if !ok {
				p.kill()
				return nil, errors.New("the Python bridge exited before its kernel was ready (are python3-ipykernel and python3-jupyter-client installed?)")
			}
			switch lineType(line) {
			case "ready":
				var r struct {
					KernelPID int `json:"kernel_pid"`
				}
				_ = json.Unmarshal(line, &r)
				k.kernelPID = r.KernelPID
				return k, nil
			case "fatal":
				var f struct{ Name, Value string }
				_ = json.Unmarshal(line, &f)
				p.kill()
				return nil, fmt.Errorf("the Python kernel did not start: %s: %s", f.Name, f.Value)
			}
		case <-timer.C:
			p.kill()
			return nil, fmt.Errorf("the Python kernel was not ready within %s", kernelStartTimeout)
		}
	}
}

// read passes the bridge's lines to k.lines until its output ends. A line
// over maxLine becomes an error line.
func (k *pythonKernel) read(f *os.File) {
	defer close(k.lines)
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	for {
		line, err := readLine(br)
		if errors.Is(err, errLineTooLong) {
			k.lines <- errorLine("OutputTooLarge", fmt.Sprintf("an output of the cell was over %d bytes and was dropped", maxLine), "")
			continue
		}
		if err != nil {
			return
		}
		k.lines <- line
	}
}

func (k *pythonKernel) run(c cell, interrupt <-chan struct{}, emit func([]byte)) {
	k.cells++
	id := k.cells
	req, _ := json.Marshal(map[string]any{"op": "execute", "id": id, "code": c.code, "env_vars": c.env, "seed": c.session})
	if _, err := k.p.stdin.Write(append(req, '\n')); err != nil {
		emit(errorLine("KernelDied", "the Python kernel is gone; the next call restarts it", ""))
		k.kill()
		return
	}
	var grace <-chan time.Time
	for {
		select {
		case line, ok := <-k.lines:
			if !ok {
				emit(errorLine("KernelDied", "the Python kernel exited while running the cell; the next call restarts it", ""))
				return
			}
			switch lineType(line) {
			case "end_of_execution":
				return
			case "ready", "fatal":
			case "error":
				var e struct{ Name string }
				if json.Unmarshal(line, &e) == nil && e.Name == "KernelDied" {
					k.kill()
				}
				emit(line)
			default:
				emit(line)
			}
		case <-interrupt:
			interrupt = nil
			req, _ := json.Marshal(map[string]any{"op": "interrupt", "id": id})
			_, _ = k.p.stdin.Write(append(req, '\n'))
			grace = time.After(interruptGrace)
		case <-grace:
			emit(errorLine("KernelDied", "the cell did not stop when interrupted; its kernel was killed and the next call restarts it", ""))
			k.kill()
			return
		}
	}
}

func (k *pythonKernel) dead() bool { return k.broken || k.p.gone() }

// kill ends the kernel's process group and the bridge's.
func (k *pythonKernel) kill() {
	k.broken = true
	k.abort()
	k.p.kill()
}

// abort kills the kernel's and the bridge's process groups now, without
// waiting; safe to call while run runs (which then sees the kernel die).
// The kernel's pid comes from the bridge, a process of the sandbox's
// user: it is signalled only while it is a process of the bridge's own
// user.
func (k *pythonKernel) abort() {
	if k.kernelPID > 1 && sameUser(k.kernelPID, k.p.pid) {
		_ = syscall.Kill(-k.kernelPID, syscall.SIGKILL)
	}
	k.p.signal(syscall.SIGKILL)
}

// sameUser reports whether processes a and b have the same real uid
// (/proc/PID/status), false when either is gone.
func sameUser(a, b int) bool {
	ua, ok := procUID(a)
	if !ok {
		return false
	}
	ub, ok := procUID(b)
	return ok && ua == ub
}

// procUID returns process pid's real uid.
func procUID(pid int) (string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Uid:"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				return f[0], true
			}
		}
	}
	return "", false
}

func (k *pythonKernel) close() {
	k.kill()
	// Unblock the reader if nobody reads its lines any more.
	go func() {
		for range k.lines {
		}
	}()
}
