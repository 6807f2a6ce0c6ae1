package interp

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
	"unicode/utf8"
)

// Sources of a streamKernel's events.
const (
	srcStdout = 1
	srcStderr = 2
	srcProto  = 3
)

// event is a piece of a streamKernel's output.
type event struct {
	src  int
	data []byte
	mark bool // the end marker of a cell (stdout, stderr)
	eof  bool // the source ended
}

// streamKernel is an interpreter whose cells write to its own stdout and
// stderr (bash, node): each cell is one request on its stdin; the driver
// ends it with the kernel's end marker on stdout and on stderr, and the
// line {"type":"end","rc":N} on descriptor 3, where it also writes the
// cell's result and error lines. The marker is random per process; a cell
// that prints it ends only its own output early.
type streamKernel struct {
	lang   string
	p      *process
	mark   []byte
	events chan event
	count  int
	// request encodes a cell as what the driver reads on its stdin.
	request func(c cell) ([]byte, error)
	broken  bool // the process was killed or one of its outputs ended
	eofs    int  // the outputs whose end run has read
}

// newMark returns a fresh end marker: a record separator, "forkbox:",
// 32 random hex digits and a record separator.
func newMark() []byte {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return []byte("\x1eforkbox:" + hex.EncodeToString(b) + "\x1e")
}

// startStream launches argv as a stream kernel of language lang in dir,
// writes prelude (may be nil) to its stdin, and starts reading its
// outputs.
func startStream(l Launcher, lang string, argv []string, env map[string]string, dir string, mark []byte, prelude []byte, request func(cell) ([]byte, error)) (kernel, error) {
	p, outs, err := start(l, argv, env, dir, []int{1, 2, 3})
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	k := &streamKernel{lang: lang, p: p, mark: mark, events: make(chan event, 1), request: request}
	go k.pump(srcStdout, outs[0])
	go k.pump(srcStderr, outs[1])
	go k.proto(outs[2])
	if len(prelude) > 0 {
		if _, err := p.stdin.Write(prelude); err != nil {
			k.close()
			return nil, fmt.Errorf("start %s: %w", argv[0], err)
		}
	}
	return k, nil
}

// pump passes what f carries to k.events, cut at the end markers, until f
// ends. It holds back a tail that may be the start of a marker or of a
// UTF-8 sequence until the next read shows what it is.
func (k *streamKernel) pump(src int, f *os.File) {
	defer f.Close()
	buf := make([]byte, 32<<10)
	var pend []byte
	for {
		n, err := f.Read(buf)
		pend = append(pend, buf[:n]...)
		for {
			i := bytes.Index(pend, k.mark)
			if i < 0 {
				break
			}
			if i > 0 {
				k.events <- event{src: src, data: bytes.Clone(pend[:i])}
			}
			k.events <- event{src: src, mark: true}
			pend = pend[i+len(k.mark):]
		}
		keep := 0
		if err == nil {
			keep = holdBack(pend, k.mark)
		}
		if len(pend) > keep {
			k.events <- event{src: src, data: bytes.Clone(pend[:len(pend)-keep])}
			pend = append([]byte(nil), pend[len(pend)-keep:]...)
		}
		if err != nil {
			k.events <- event{src: src, eof: true}
			return
		}
	}
}

// holdBack returns how many bytes at the end of b must wait for more: the
// longest proper prefix of mark that b ends with, or an incomplete UTF-8
// sequence, whichever is longer.
func holdBack(b, mark []byte) int {
	keep := 0
	for j := min(len(mark)-1, len(b)); j > 0; j-- {
		if bytes.HasSuffix(b, mark[:j]) {
			keep = j
			break
		}
	}
	for j := 1; j <= 3 && j <= len(b); j++ {
		c := b[len(b)-j]
		if utf8.RuneStart(c) {
			if !utf8.FullRune(b[len(b)-j:]) && j > keep {
				keep = j
			}
			break
		}
	}
	return keep
}

// proto passes the JSON lines on descriptor 3 to k.events; lines that
// are not JSON objects are dropped.
func (k *streamKernel) proto(f *os.File) {
	defer f.Close()
	br := bufio.NewReaderSize(f, 64<<10)
	for {
		line, err := readLine(br)
		if errors.Is(err, errLineTooLong) {
			k.events <- event{src: srcProto, data: errorLine("OutputTooLarge", fmt.Sprintf("a result of the cell was over %d bytes and was dropped", maxLine), "")}
			continue
		}
		if err != nil {
			k.events <- event{src: srcProto, eof: true}
			return
		}
		if json.Valid(line) {
			k.events <- event{src: srcProto, data: line}
		}
	}
}

func (k *streamKernel) run(c cell, interrupt <-chan struct{}, emit func([]byte)) {
	k.count++
	emit(countLine(k.count))
	req, err := k.request(c)
	if err != nil {
		emit(errorLine("InvalidCode", err.Error(), ""))
		return
	}
	if _, err := k.p.stdin.Write(req); err != nil {
		emit(errorLine("KernelDied", fmt.Sprintf("the %s interpreter is gone; the next call restarts it", k.lang), ""))
		k.kill()
		return
	}
	var outDone, errDone, ended bool
	rc := 0
	var grace, again <-chan time.Time
	for !(outDone && errDone && ended) {
		select {
		case ev := <-k.events:
			switch {
			case ev.eof:
				k.eofs++
				emit(errorLine("KernelDied", fmt.Sprintf("the %s interpreter exited while running the cell; the next call restarts it", k.lang), ""))
				k.kill()
				return
			case ev.mark && ev.src == srcStdout:
				outDone = true
			case ev.mark:
				errDone = true
			case ev.src == srcStdout:
				emit(streamLine("stdout", string(ev.data)))
			case ev.src == srcStderr:
				emit(streamLine("stderr", string(ev.data)))
			default:
				switch lineType(ev.data) {
				case "result", "error":
					emit(ev.data)
				case "end":
					var e struct {
						RC int `json:"rc"`
					}
					_ = json.Unmarshal(ev.data, &e)
					rc, ended = e.RC, true
				}
			}
		case <-interrupt:
			interrupt = nil
			k.p.signal(syscall.SIGINT)
			grace = time.After(interruptGrace)
			again = time.After(time.Second)
		case <-again:
			// A SIGINT that came between two commands of the cell
			// stopped neither; the next one stops the command now running.
			k.p.signal(syscall.SIGINT)
			again = time.After(time.Second)
		case <-grace:
			emit(errorLine("KernelDied", fmt.Sprintf("the cell did not stop when interrupted; the %s interpreter was killed and the next call restarts it", k.lang), ""))
			k.kill()
			return
		}
	}
	if rc != 0 {
		emit(errorLine("ExitError", fmt.Sprintf("exit status %d", rc), ""))
	}
}

// kill ends the interpreter's process group, and reads what its outputs
// still carry until they end (so no reader stays blocked).
func (k *streamKernel) kill() {
	if k.broken {
		return
	}
	k.broken = true
	k.p.kill()
	go func() {
		for open := 3 - k.eofs; open > 0; {
			if ev := <-k.events; ev.eof {
				open--
			}
		}
	}()
}

func (k *streamKernel) dead() bool { return k.broken || k.p.gone() }

func (k *streamKernel) close() { k.kill() }

// abort kills the interpreter's process group now, without waiting; safe
// to call while run runs (which then sees the interpreter die).
func (k *streamKernel) abort() { k.p.signal(syscall.SIGKILL) }
