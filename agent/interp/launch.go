package interp

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"syscall"
	"time"
)

// Launcher starts the service's interpreter processes. forkbox-agent's
// implementation runs them as the session's default user, in their own
// process group, with the session's environment, through its reaper (it
// is pid 1); tests use a plain one.
type Launcher interface {
	// Launch starts argv (argv[0] is looked up in the session's PATH)
	// in directory dir with the session's environment overlaid by env,
	// and files as its descriptors 0, 1, 2, 3 ... (nil: /dev/null). The
	// process leads a new process group (pgid = pid). It returns the pid
	// and a channel closed once the process has exited and been reaped.
	// An error means nothing was started.
	Launch(argv []string, env map[string]string, dir string, files []*os.File) (pid int, exited <-chan struct{}, err error)
	// Workdir is the contexts' default working directory (the
	// session's, else the default user's home); relative cwds start
	// there.
	Workdir() string
	// Identity names whom Launch starts processes as and where (the
	// session's default user and working directory): a kernel started
	// for another identity and not used yet is restarted.
	Identity() string
	// Env is the session's environment now (the variables set at create
	// and by /init); a Python kernel takes changes of it before a cell.
	Env() map[string]string
}

// maxLine bounds one protocol line read from an interpreter, in bytes (a
// result with a large PNG or HTML table fits; a longer line is dropped
// and replaced by an error line). With one line being read, one waiting
// in a channel of one and one being written, a context holds at most
// about three lines whatever its client reads.
const maxLine = 8 << 20

// errLineTooLong reports a protocol line over maxLine.
var errLineTooLong = errors.New("line too long")

// readLine reads one newline-terminated line from br, without the newline.
// A line over maxLine is consumed whole and errLineTooLong returned; at
// the end of input it returns io.EOF (a partial last line is dropped).
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	over := false
	for {
		frag, err := br.ReadSlice('\n')
		if !over {
			if len(line)+len(frag) > maxLine+1 {
				over, line = true, nil
			} else {
				line = append(line, frag...)
			}
		}
		switch {
		case err == nil:
			if over {
				return nil, errLineTooLong
			}
			return bytes.TrimSuffix(line, []byte("\n")), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return nil, err
		}
	}
}

// lineType returns the "type" member of a JSON protocol line ("" when it
// is not a JSON object with a string type).
func lineType(line []byte) string {
	var v struct {
		Type string `json:"type"`
	}
	if json.Unmarshal(line, &v) != nil {
		return ""
	}
	return v.Type
}

// errorLine returns an E2B error line: name, value and traceback.
func errorLine(name, value, traceback string) []byte {
	b, _ := json.Marshal(map[string]string{"type": "error", "name": name, "value": value, "traceback": traceback})
	return b
}

// streamLine returns an E2B stdout or stderr line of text, stamped now.
func streamLine(stream, text string) []byte {
	b, _ := json.Marshal(map[string]string{"type": stream, "text": text, "timestamp": time.Now().UTC().Format(time.RFC3339Nano)})
	return b
}

// countLine returns E2B's number_of_executions line for execution n.
func countLine(n int) []byte {
	b, _ := json.Marshal(map[string]any{"type": "number_of_executions", "execution_count": n})
	return b
}

// process is a started interpreter: its pid (and process group), the
// pipe its requests are written to, the read ends of its output pipes,
// and its exit.
type process struct {
	pid    int
	stdin  *os.File
	outs   []*os.File
	exited <-chan struct{}
}

// start launches argv with pipes for the descriptors in want (0: the
// request pipe kept in p.stdin; any other: an output pipe whose read end
// is returned, in want's order). The other descriptors up to the highest
// wanted are /dev/null.
func start(l Launcher, argv []string, env map[string]string, dir string, outs []int) (*process, []*os.File, error) {
	n := 3
	for _, fd := range outs {
		if fd+1 > n {
			n = fd + 1
		}
	}
	files := make([]*os.File, n)
	var mine, theirs []*os.File
	fail := func(err error) (*process, []*os.File, error) {
		for _, f := range append(mine, theirs...) {
			_ = f.Close()
		}
		return nil, nil, err
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	mine, theirs = append(mine, inW), append(theirs, inR)
	files[0] = inR
	reads := make([]*os.File, 0, len(outs))
	for _, fd := range outs {
		r, w, err := os.Pipe()
		if err != nil {
			return fail(err)
		}
		mine, theirs = append(mine, r), append(theirs, w)
		files[fd] = w
		reads = append(reads, r)
	}
	pid, exited, err := l.Launch(argv, env, dir, files)
	if err != nil {
		return fail(err)
	}
	for _, f := range theirs {
		_ = f.Close()
	}
	return &process{pid: pid, stdin: inW, outs: reads, exited: exited}, reads, nil
}

// gone reports whether p has exited.
func (p *process) gone() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// signal sends sig to p's whole process group (the interpreter and what
// the cell started). A group that is gone is not an error.
func (p *process) signal(sig syscall.Signal) {
	_ = syscall.Kill(-p.pid, sig)
}

// kill ends p's process group, waits (up to 5 s) for p to be reaped and
// closes the read ends of its outputs: a process that left the group
// (setsid) and still holds one then writes into a closed pipe, and no
// reader of p's stays blocked.
func (p *process) kill() {
	_ = p.stdin.Close()
	p.signal(syscall.SIGKILL)
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
	}
	for _, f := range p.outs {
		_ = f.Close()
	}
}

// drain copies r to nothing until it ends, then closes it (a pipe that is
// not read would block its writer).
func drain(r io.ReadCloser) {
	_, _ = io.Copy(io.Discard, r)
	_ = r.Close()
}
