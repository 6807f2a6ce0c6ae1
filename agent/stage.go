package agent

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/guest/wire"
)

// Staged inputs. A large exec input (a command text or stdin data, up to
// 32 MiB in the daemon's API) is streamed into the agent before the
// command starts instead of travelling inside the Start message, which
// both the daemon and the agent would hold whole (several times over:
// request, decoded message, copy). POST /stage copies a request body into
// a memfd, whose pages count against the sandbox's own memory limit, and
// answers its id; a Start or SendInput request then names it in a header
// and takes it. These are forkbox's own endpoints: the E2B envd proxy
// neither forwards them nor the headers.

// Stage limits.
const (
	// maxStages bounds the staged inputs an agent holds at once.
	maxStages = 256
	// stageTTL is how long a staged input waits to be taken.
	stageTTL = 5 * time.Minute
	// memoryReserve is the memory, in bytes, a stage or a collected output
	// must leave free in the sandbox: memfd pages are not reclaimable, and
	// a sandbox whose memory they fill has its processes killed, the agent
	// last (its OOM score is lower).
	memoryReserve = 16 << 20
)

// stageTable holds staged inputs by id. Safe for concurrent use.
type stageTable struct {
	mu sync.Mutex
	m  map[string]*staged
}

type staged struct {
	f     *os.File
	size  int64
	timer *time.Timer
}

func newStageTable() *stageTable { return &stageTable{m: map[string]*staged{}} }

// add registers f and returns its id, or an error when the table is full.
func (t *stageTable) add(f *os.File, size int64) (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	id := hex.EncodeToString(b[:])
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.m) >= maxStages {
		return "", &httpError{status: http.StatusTooManyRequests, msg: fmt.Sprintf("%d staged inputs wait already", maxStages)}
	}
	s := &staged{f: f, size: size}
	s.timer = time.AfterFunc(stageTTL, func() {
		if f := t.take(id); f != nil {
			_ = f.Close()
		}
	})
	t.m[id] = s
	return id, nil
}

// take removes the input id and returns its file, positioned at its
// start, or nil when there is none (unknown, taken or expired).
func (t *stageTable) take(id string) *os.File {
	t.mu.Lock()
	s := t.m[id]
	delete(t.m, id)
	t.mu.Unlock()
	if s == nil {
		return nil
	}
	s.timer.Stop()
	_, _ = s.f.Seek(0, io.SeekStart)
	return s.f
}

// takeHeader takes the input named by header h, if the header is set: an
// unknown id is an error.
func (t *stageTable) takeHeader(h http.Header, name string) (*os.File, error) {
	id := h.Get(name)
	if id == "" {
		return nil, nil
	}
	f := t.take(id)
	if f == nil {
		return nil, fmt.Errorf("%s: no staged input %q (taken, expired or never made)", name, id)
	}
	return f, nil
}

// handleStage serves POST /stage: the body goes into a new memfd. The
// reply is 200 wire.StageReply, or a JSON error: 507 when the sandbox's memory
// has no room for it (the limit less memoryReserve), 429 when maxStages
// wait already.
func (a *Agent) handleStage(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength > 0 {
		if err := checkMemoryRoom(r.ContentLength); err != nil {
			writeFileError(w, err)
			return
		}
	}
	f, err := newMemfd("forkbox-stage")
	if err != nil {
		writeFileError(w, err)
		return
	}
	n, err := copyChecked(f, r.Body)
	if err != nil {
		f.Close()
		writeFileError(w, err)
		return
	}
	id, err := a.stages.add(f, n)
	if err != nil {
		f.Close()
		writeFileError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(wire.StageReply{ID: id, Size: n})
}

// handleUnstage serves DELETE /stage/{id}: the input is dropped (204, also
// when there is none).
func (a *Agent) handleUnstage(w http.ResponseWriter, r *http.Request) {
	if f := a.stages.take(r.PathValue("id")); f != nil {
		_ = f.Close()
	}
	w.WriteHeader(http.StatusNoContent)
}

func newMemfd(name string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// checkStep is how much a memfd may grow between two checks of the
// sandbox's free memory, in bytes.
const checkStep = 1 << 20

// copyChecked copies r into f, checking before every checkStep that the
// sandbox's memory has room for it.
func copyChecked(f *os.File, r io.Reader) (int64, error) {
	buf := make([]byte, 32<<10)
	var n, checked int64
	for {
		if n-checked >= checkStep {
			if err := checkMemoryRoom(checkStep); err != nil {
				return n, err
			}
			checked = n
		}
		m, err := r.Read(buf)
		if m > 0 {
			if _, werr := f.Write(buf[:m]); werr != nil {
				return n, werr
			}
			n += int64(m)
		}
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, badRequest("reading the input: %v", err)
		}
	}
}

// checkMemoryRoom returns a 507 httpError when the sandbox's memory cannot
// take n more bytes and keep memoryReserve free; nil when it can or when
// its limit is unknown.
func checkMemoryRoom(n int64) error {
	free, ok := memoryFree()
	if !ok || free-n >= memoryReserve {
		return nil
	}
	return &httpError{status: http.StatusInsufficientStorage,
		msg: fmt.Sprintf("the sandbox's memory has %d MiB free; %d MiB more would leave less than %d MiB",
			max(free, 0)>>20, (n+(1<<20)-1)>>20, memoryReserve>>20)}
}
