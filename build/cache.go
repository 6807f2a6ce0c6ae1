package build

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// cacheVersion is in every key: a change of how steps are run or keyed
// bumps it, so no result of an older builder is reused.
const cacheVersion = "forkbox-build/1"

// Cache maps step keys to the snapshots that hold the steps' results,
// one JSON file per tenant and key in a directory of the data
// directory (DATA/build-cache/TENANT-HASH/KEY.json). A key whose
// snapshot was deleted is a miss (the caller checks the snapshot).
type Cache struct{ dir string }

// NewCache returns the cache kept in dir (made when first written).
func NewCache(dir string) *Cache { return &Cache{dir: dir} }

// cacheEntry is one cached step.
type cacheEntry struct {
	Snapshot  string    `json:"snapshot"`
	CreatedAt time.Time `json:"created_at"`
}

// path is the file of tenant's key.
func (c *Cache) path(tenant, key string) string {
	t := sha256.Sum256([]byte(tenant))
	return filepath.Join(c.dir, hex.EncodeToString(t[:8]), key+".json")
}

// Get returns the snapshot cached under key for tenant ("" for a step
// that changed no file) and whether the cache has key.
func (c *Cache) Get(tenant, key string) (string, bool) {
	var e cacheEntry
	if checkKey(key) != nil || storage.ReadJSON(c.path(tenant, key), &e, "build cache entry") != nil {
		return "", false
	}
	return e.Snapshot, true
}

// Put records snap as the result of key for tenant (atomically; "" for
// a step that changed no file).
func (c *Cache) Put(tenant, key, snap string) error {
	if err := checkKey(key); err != nil {
		return err
	}
	p := c.path(tenant, key)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	return storage.WriteJSON(p, &cacheEntry{Snapshot: snap, CreatedAt: time.Now().UTC()}, 0o600)
}

// Forget drops key for tenant (a snapshot that is gone); a missing key
// is not an error.
func (c *Cache) Forget(tenant, key string) error {
	err := os.Remove(c.path(tenant, key))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// state is what a Dockerfile's instructions have set so far: what each
// step after them runs with.
type state struct {
	env     []string // KEY=VALUE, in order of definition
	args    map[string]string
	argSet  []string // ARG names in order of declaration
	workdir string
	user    string
	cmd     []string
	entry   []string
	cmdSet  bool
	entSet  bool
	// ready is the ready check (HEALTHCHECK CMD; nil: none), readyS its
	// timeout in seconds (HEALTHCHECK --start-period; 0: the default).
	ready  []string
	readyS int64
}

// getenv returns the value of key in env (KEY=VALUE pairs).
func getenv(env []string, key string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if k, v, _ := strings.Cut(env[i], "="); k == key {
			return v, true
		}
	}
	return "", false
}

// setenv sets key to value in env, replacing an earlier value in place.
func setenv(env []string, key, value string) []string {
	for i, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == key {
			out := append([]string(nil), env...)
			out[i] = key + "=" + value
			return out
		}
	}
	return append(append([]string(nil), env...), key+"="+value)
}

// runEnv is the environment a RUN gets: the ARGs in scope (Docker
// passes them to RUN), then ENV, which wins over an ARG of the same
// name.
func (s *state) runEnv() map[string]string {
	out := map[string]string{}
	for _, k := range s.argSet {
		out[k] = s.args[k]
	}
	for _, kv := range s.env {
		k, v, _ := strings.Cut(kv, "=")
		out[k] = v
	}
	return out
}

// expandEnv is the environment ${VAR} in an instruction expands from
// (runEnv as KEY=VALUE).
func (s *state) expandEnv() []string {
	m := s.runEnv()
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// stepKey is the cache key of a step that changes files: the key of the
// step before it (or of the FROM), what kind of step it is, its
// instruction as it runs after expansion, the state it runs in (every
// variable of runEnv, the user and the working directory) and the
// digest of its inputs (a COPY's sources; "" for others). A hex sha256.
func stepKey(parent, kind, instr string, s *state, inputs string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\nparent %s\nkind %s\ninstr %q\nuser %q\nworkdir %q\ninputs %s\n", cacheVersion, parent, kind, instr, s.user, s.workdir, inputs)
	for _, kv := range s.expandEnv() {
		fmt.Fprintf(h, "env %q\n", kv)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// fromKey is the key a build starts from: the template's name and
// version (its creation time and digest, so a template deleted and made
// again under the name is another start) and the isolation tier.
func fromKey(tpl *storage.Template, isolation string) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\nfrom %q\nversion %q %q\ntier %q\n", cacheVersion, tpl.Name, tpl.CreatedAt, tpl.Digest, isolation)
	return hex.EncodeToString(h.Sum(nil))
}

// checkKey makes sure key is a key (64 hex digits) before it is a file name.
func checkKey(key string) error {
	if len(key) != 64 || strings.Trim(key, "0123456789abcdef") != "" {
		return errdefs.Newf(errdefs.ErrInternal, "bad build cache key %q", key)
	}
	return nil
}
