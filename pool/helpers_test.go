package pool

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
)

// procCore is a Core whose members are real processes: a template names
// the program a member runs ("sleep" keeps running; "missing" names a
// program that does not exist, so its launches fail in exec). Adopt
// checks that the member's process is still alive, Discard kills it and
// reaps it. The pools see real failures and real timing, not canned
// answers.
type procCore struct {
	mu       sync.Mutex
	procs    map[string]*exec.Cmd // live members by id
	seq      int
	launches map[string]int // launch attempts by template
	// hold, when not nil, makes Launch wait for it to be closed.
	hold chan struct{}
	// maxStarting is the most launches seen in progress at once.
	starting, maxStarting int
}

var programs = map[string][]string{
	"sleep":   {"sleep", "600"},
	"missing": {"/nonexistent/forkbox-pool-test-program"},
}

func newProcCore(t *testing.T) *procCore {
	c := &procCore{procs: map[string]*exec.Cmd{}, launches: map[string]int{}}
	t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, cmd := range c.procs {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return c
}

func (c *procCore) Normalize(spec *node.CreateSpec) error {
	if spec.CPU == 0 {
		spec.CPU = 1
	}
	if spec.MemoryMB == 0 {
		spec.MemoryMB = 512
	}
	if spec.CPU > 8 {
		return errdefs.InvalidField("cpu", "must be between 1 and 8")
	}
	return nil
}

func (c *procCore) CheckTemplate(name string) error {
	if _, ok := programs[name]; !ok {
		return errdefs.Newf(errdefs.ErrNotFound, "template %q", name)
	}
	return nil
}

func (c *procCore) DefaultDriver() string { return "proc" }

func (c *procCore) Launch(ctx context.Context, spec node.CreateSpec) (string, error) {
	c.mu.Lock()
	c.launches[spec.Template]++
	c.starting++
	c.maxStarting = max(c.maxStarting, c.starting)
	hold := c.hold
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.starting--
		c.mu.Unlock()
	}()
	if hold != nil {
		<-hold
	}
	argv := programs[spec.Template]
	cmd := exec.Command(argv[0], argv[1:]...)
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("launch member: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	id := fmt.Sprintf("member%d-%s-%d", c.seq, spec.Template, spec.MemoryMB)
	c.procs[id] = cmd
	return id, nil
}

func (c *procCore) Adopt(ctx context.Context, id string, spec node.CreateSpec, key, hash string) (*node.Session, error) {
	c.mu.Lock()
	cmd := c.procs[id]
	c.mu.Unlock()
	if cmd == nil {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "member %s", id)
	}
	if err := cmd.Process.Signal(syscall.Signal(0)); err != nil {
		return nil, fmt.Errorf("member %s: %w", id, err)
	}
	if spec.User == "nobody-here" {
		return nil, errdefs.InvalidField("user", "no user %q in the sandbox", spec.User)
	}
	c.mu.Lock()
	delete(c.procs, id) // a session now, not a member
	c.mu.Unlock()
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	return &node.Session{ID: id, Template: spec.Template, State: node.StateRunning, IdempotencyKey: key, RequestHash: hash}, nil
}

func (c *procCore) Discard(ctx context.Context, id, why string) error {
	c.mu.Lock()
	cmd := c.procs[id]
	delete(c.procs, id)
	c.mu.Unlock()
	if cmd == nil {
		return errdefs.Newf(errdefs.ErrNotFound, "member %s", id)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	return nil
}

// LaunchSpare makes a spare: a member running "sleep", whose id says it
// is a spare.
func (c *procCore) LaunchSpare(ctx context.Context) (string, error) {
	id, err := c.Launch(ctx, node.CreateSpec{Template: "sleep"})
	if err != nil {
		return "", err
	}
	return "spare-" + id, c.rename(id, "spare-"+id)
}

func (c *procCore) rename(from, to string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.procs[to] = c.procs[from]
	delete(c.procs, from)
	return nil
}

// alive returns the ids of the member processes that run.
func (c *procCore) alive() map[string]bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]bool{}
	for id, cmd := range c.procs {
		if cmd.Process.Signal(syscall.Signal(0)) == nil {
			out[id] = true
		}
	}
	return out
}

func (c *procCore) launched(template string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.launches[template]
}

// newPools returns pools over c and a fresh store, loaded.
func newPools(t *testing.T, c *procCore) (*Pools, *store.Store) {
	return newPoolsSpares(t, c, 0)
}

// newPoolsSpares is newPools keeping spares spares ready.
func newPoolsSpares(t *testing.T, c *procCore, spares int) (*Pools, *store.Store) {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "forkbox.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ps := New(Options{Core: c, Store: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Spares: spares})
	t.Cleanup(ps.Close)
	if err := ps.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	return ps, st
}

// waitFor polls cond until it holds (a hang guard of 30 s, not a
// performance bound).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func status(ps *Pools, template string) node.PoolStatus {
	for _, p := range ps.PoolList() {
		if p.Template == template {
			return p
		}
	}
	return node.PoolStatus{}
}
