package interp

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"
)

// MaxContexts bounds the contexts of one sandbox (each is an interpreter
// process; the sandbox's memory limit bounds them too).
const MaxContexts = 32

// Context is a context as the protocol shows it (E2B's
// {"id","language","cwd"}).
type Context struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// codeContext is a context and its interpreter.
type codeContext struct {
	Context
	// mu is held by a running cell, a restart and a delete: one cell at a
	// time per context, the next waiting its turn.
	mu      sync.Mutex
	k       kernel // nil until the first cell (or after a restart)
	deleted bool
	// ident is the Launcher's Identity when k started; used is set by
	// the first cell k ran (a warm kernel not used yet follows a change
	// of identity by restarting).
	ident string
	used  bool
	// dflt marks a language's default context, whose working directory
	// follows the session's until its first cell.
	dflt bool
	// running is the kernel running a cell now (nil: none), for Delete
	// and Restart to abort without waiting for the cell. runMu also
	// guards Context's fields (Cwd changes under c.mu), for List to read
	// while a cell runs.
	runMu   sync.Mutex
	running kernel
}

// abortRunning kills the interpreter of the cell c runs now, if any (the
// cell then ends with a KernelDied line and releases c.mu).
func (c *codeContext) abortRunning() {
	c.runMu.Lock()
	defer c.runMu.Unlock()
	if c.running != nil {
		c.running.abort()
	}
}

// setRunning records k as running a cell (nil: the cell ended).
func (c *codeContext) setRunning(k kernel) {
	c.runMu.Lock()
	c.running = k
	c.runMu.Unlock()
}

// Service is the code-execution service of one sandbox: its contexts,
// each with its own interpreter. It is safe for concurrent use.
type Service struct {
	l Launcher

	mu       sync.Mutex
	contexts map[string]*codeContext
	defaults map[string]*codeContext // the default context of each language
	closed   bool
	// ending counts deleted contexts whose interpreter is not closed yet;
	// they count against MaxContexts until it is.
	ending int
}

// NewService returns a service that starts its interpreters through l.
func NewService(l Launcher) *Service {
	return &Service{l: l, contexts: map[string]*codeContext{}, defaults: map[string]*codeContext{}}
}

// Errors of the service's calls, which the HTTP edge maps to statuses.
var (
	// errNotFound: no context has the id (404).
	errNotFound = errors.New("not found")
	// errInvalid: bad input (400).
	errInvalid = errors.New("invalid")
	// errTooMany: MaxContexts reached (429).
	errTooMany = errors.New("too many contexts")
	// errClosed: the service was closed (503).
	errClosed = errors.New("closed")
)

// Create makes a context of language (see languageOf) with working
// directory cwd ("" the Launcher's Workdir; a relative one starts there), which must
// exist, and starts its interpreter. An interpreter that cannot start is
// an error, and then no context is left.
func (s *Service) Create(language, cwd string) (Context, error) {
	c, err := s.newContext(language, cwd)
	if err != nil {
		return Context{}, err
	}
	c.mu.Lock()
	err = c.ensure(s.l)
	c.mu.Unlock()
	if err != nil {
		_ = s.Delete(c.ID)
		return Context{}, err
	}
	return c.Context, nil
}

// newContext makes and registers a context (see Create).
func (s *Service) newContext(language, cwd string) (*codeContext, error) {
	lang, err := languageOf(language)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errInvalid, err)
	}
	dir := s.l.Workdir()
	if cwd != "" {
		dir = cwd
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(s.l.Workdir(), dir)
		}
		dir = filepath.Clean(dir)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("%w: cwd %q is not an existing directory", errInvalid, dir)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("%w: the code-execution service is shut down", errClosed)
	}
	if len(s.contexts)+s.ending >= MaxContexts {
		return nil, fmt.Errorf("%w: a sandbox has at most %d contexts; delete one first", errTooMany, MaxContexts)
	}
	c := &codeContext{Context: Context{ID: newID(), Language: lang, Cwd: dir}}
	s.contexts[c.ID] = c
	return c, nil
}

// newID returns a random context id (a UUID, version 4, as the
// reference's).
func newID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// List returns the contexts, the default ones included, by language and
// then id.
func (s *Service) List() []Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Context, 0, len(s.contexts))
	for _, c := range s.contexts {
		c.runMu.Lock()
		out = append(out, c.Context)
		c.runMu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Language != out[j].Language {
			return out[i].Language < out[j].Language
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// lookup returns context id, or the default context of language when id
// is "" (made on first use).
func (s *Service) lookup(id, language string) (*codeContext, error) {
	if id != "" {
		s.mu.Lock()
		defer s.mu.Unlock()
		c, ok := s.contexts[id]
		if !ok {
			return nil, fmt.Errorf("%w: Context %s not found", errNotFound, id)
		}
		return c, nil
	}
	lang, err := languageOf(language)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errInvalid, err)
	}
	s.mu.Lock()
	c, ok := s.defaults[lang]
	s.mu.Unlock()
	if ok {
		return c, nil
	}
	c, err = s.newContext(lang, "")
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.defaults[lang]; ok { // another call made it first
		delete(s.contexts, c.ID)
		return d, nil
	}
	c.dflt = true
	s.defaults[lang] = c
	return c, nil
}

// Delete ends context id and its interpreter; a running cell is killed
// with it.
func (s *Service) Delete(id string) error {
	s.mu.Lock()
	c, ok := s.contexts[id]
	if ok {
		delete(s.contexts, id)
		if s.defaults[c.Language] == c {
			delete(s.defaults, c.Language)
		}
		s.ending++
	}
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: Context %s not found", errNotFound, id)
	}
	defer func() {
		s.mu.Lock()
		s.ending--
		s.mu.Unlock()
	}()
	c.abortRunning()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deleted = true
	if c.k != nil {
		c.k.close()
		c.k = nil
	}
	return nil
}

// Restart gives context id a new interpreter: its state is gone, its id,
// language and working directory stay. A running cell is killed with the
// old interpreter; Restart returns once the new one is ready.
func (s *Service) Restart(id string) error {
	s.mu.Lock()
	c, ok := s.contexts[id]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: Context %s not found", errNotFound, id)
	}
	c.abortRunning()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.k != nil {
		c.k.close()
		c.k = nil
	}
	return c.ensure(s.l)
}

// ensure starts c's interpreter if it has none or it died. c.mu is held.
func (c *codeContext) ensure(l Launcher) error {
	if c.deleted {
		return fmt.Errorf("%w: Context %s not found", errNotFound, c.ID)
	}
	ident := l.Identity()
	if c.k != nil && !c.k.dead() && (c.used || c.ident == ident) {
		return nil
	}
	if c.k != nil {
		c.k.close()
		c.k = nil
	}
	if c.dflt && !c.used {
		c.runMu.Lock()
		c.Cwd = l.Workdir()
		c.runMu.Unlock()
	}
	k, err := startKernel(l, c.Language, c.Cwd)
	if err != nil {
		return err
	}
	c.k, c.ident, c.used = k, ident, false
	return nil
}

// Warm starts the default Python context's kernel now, so the first call
// finds it ready. Errors are returned (the caller logs them); a later call
// tries again.
func (s *Service) Warm() error {
	c, err := s.lookup("", Python)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ensure(s.l)
}

// Execute runs code in context id (or, when id is "", the default context
// of language), passing each output line to emit. ctx ending (the client
// went away) interrupts the cell; Execute still returns only once the cell
// has ended. Its errors are those of finding the context (errNotFound,
// errInvalid); a kernel that cannot start or dies is an error line.
func (s *Service) Execute(ctx context.Context, id, language, code string, env map[string]string, emit func([]byte)) error {
	c, err := s.lookup(id, language)
	if err != nil {
		return err
	}
	return s.execute(ctx, c, code, env, emit)
}

// execute runs code in c (see Execute). A cell whose caller went away
// while it waited for its turn does not run.
func (s *Service) execute(ctx context.Context, c *codeContext, code string, env map[string]string, emit func([]byte)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ctx.Err() != nil {
		return nil
	}
	if err := c.ensure(s.l); err != nil {
		if errors.Is(err, errNotFound) {
			return err
		}
		emit(errorLine("KernelStartError", err.Error(), ""))
		return nil
	}
	interrupt := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { close(interrupt) })
	defer stop()
	c.used = true
	c.setRunning(c.k)
	c.k.run(cell{code: code, env: env, session: s.l.Env()}, interrupt, emit)
	c.setRunning(nil)
	return nil
}

// Close ends every context's interpreter; the service takes no calls
// after it.
func (s *Service) Close() {
	s.mu.Lock()
	cs := make([]*codeContext, 0, len(s.contexts))
	for _, c := range s.contexts {
		cs = append(cs, c)
	}
	s.contexts, s.defaults, s.closed = map[string]*codeContext{}, map[string]*codeContext{}, true
	s.mu.Unlock()
	for _, c := range cs {
		c.mu.Lock()
		c.deleted = true
		if c.k != nil {
			c.k.close()
			c.k = nil
		}
		c.mu.Unlock()
	}
}
