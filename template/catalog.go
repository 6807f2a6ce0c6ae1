// Package template is the catalog of templates a sandbox can start from: the
// built-in "base" template (host system directories read-only plus a
// synthesized /etc) and OCI images imported from an OCI layout or a
// `docker save` tarball. Each template is a read-only root filesystem in the
// data directory plus a row in the store.
package template

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/image"
	"github.com/forkbox/forkbox/store"
)

// Catalog manages templates. It is safe for concurrent use.
type Catalog struct {
	layout storage.Layout
	store  *store.Store
	shift  storage.IDShift
	// inUse reports whether a live session uses a template (set by the daemon).
	inUse func(name string) bool

	mu sync.Mutex // serialises imports and deletes
}

// NewCatalog returns the catalog over layout and st. inUse, when not nil,
// tells Delete whether live sessions still use a template.
func NewCatalog(layout storage.Layout, st *store.Store, shift storage.IDShift, inUse func(string) bool) *Catalog {
	return &Catalog{layout: layout, store: st, shift: shift, inUse: inUse}
}

// EnsureBase builds the base template if it is missing or was built by an
// older forkbox, and records it. Sandboxes still running on an old base
// keep their (renamed-away) copy until the next restart's cleanup.
func (c *Catalog) EnsureBase(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	dir := c.layout.Template(storage.BaseTemplate)
	if storage.BaseIsCurrent(dir) {
		return nil
	}
	tmp, err := c.tempDir()
	if err != nil {
		return err
	}
	t, err := storage.BuildBase(tmp, c.shift)
	if err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("build base template: %w", err)
	}
	if err := c.swapIn(tmp, dir); err != nil {
		return err
	}
	return c.record(ctx, t, storage.RootFS(dir))
}

// Import unpacks the image at src (an OCI layout directory, or a tarball
// from `docker save` or of an OCI layout) as template name. ref picks one
// image when src holds several. ErrConflict when name exists;
// ErrInvalidArgument for a bad name or image.
func (c *Catalog) Import(ctx context.Context, name, src, ref string) (*storage.Template, error) {
	if !storage.ValidTemplateName(name) {
		return nil, errdefs.InvalidField("name", "must be 1-63 characters of [a-z0-9._-]")
	}
	if name == storage.BaseTemplate {
		return nil, errdefs.InvalidField("name", "%q is the built-in template", name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	dir := c.layout.Template(name)
	if _, err := os.Stat(dir); err == nil {
		return nil, errdefs.Newf(errdefs.ErrConflict, "template %q exists; delete it first", name)
	}
	tmp, err := c.tempDir()
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	img, err := image.Import(ctx, src, ref, storage.RootFS(tmp),
		image.IDShift{UIDBase: c.shift.UIDBase, GIDBase: c.shift.GIDBase, Size: c.shift.Size})
	if err != nil {
		return nil, err
	}
	if err := storage.PrepareUserDirs(storage.RootFS(tmp), c.shift); err != nil {
		return nil, fmt.Errorf("prepare template: %w", err)
	}
	t := &storage.Template{
		Name: name, Source: src, Digest: img.Digest, Env: img.Env, Workdir: img.WorkingDir,
		SizeBytes: img.SizeBytes, CreatedAt: time.Now().UTC().Format(time.RFC3339),
	}
	if err := storage.SaveTemplate(tmp, t); err != nil {
		return nil, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return nil, err
	}
	ok = true
	return t, c.record(ctx, t, storage.RootFS(dir))
}

// Get returns template name's metadata; ErrNotFound when absent.
func (c *Catalog) Get(ctx context.Context, name string) (*storage.Template, error) {
	if !storage.ValidTemplateName(name) {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "template %q", name)
	}
	return storage.LoadTemplate(c.layout.Template(name))
}

// List returns every template, by name.
func (c *Catalog) List(ctx context.Context) ([]*storage.Template, error) {
	recs, err := c.store.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*storage.Template, 0, len(recs))
	for _, r := range recs {
		t, err := storage.LoadTemplate(c.layout.Template(r.Name))
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // its directory is gone; Delete or a re-import fixes the row
		}
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

// Delete removes template name. The base template cannot be deleted, and
// a template that live sessions use is ErrConflict.
func (c *Catalog) Delete(ctx context.Context, name string) error {
	if name == storage.BaseTemplate {
		return errdefs.Newf(errdefs.ErrConflict, "the built-in template %q cannot be deleted", name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.Get(ctx, name); err != nil {
		return err
	}
	if c.inUse != nil && c.inUse(name) {
		return errdefs.Newf(errdefs.ErrConflict, "template %q is used by running sessions", name)
	}
	trash, err := c.tempDir()
	if err != nil {
		return err
	}
	if err := os.Remove(trash); err != nil {
		return err
	}
	if err := os.Rename(c.layout.Template(name), trash); err != nil {
		return err
	}
	if err := c.store.DeleteTemplate(ctx, name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	return os.RemoveAll(trash)
}

// tempDir makes a fresh hidden directory under the templates directory, on
// the same filesystem so that a finished template can be renamed into place.
func (c *Catalog) tempDir() (string, error) {
	if err := os.MkdirAll(c.layout.Templates(), 0o711); err != nil {
		return "", err
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	dir := filepath.Join(c.layout.Templates(), ".tmp-"+hex.EncodeToString(b))
	return dir, os.Mkdir(dir, 0o711)
}

// swapIn replaces dir with tmp atomically enough: the old dir is renamed
// away and removed after tmp is in place.
func (c *Catalog) swapIn(tmp, dir string) error {
	if _, err := os.Stat(dir); err == nil {
		old := tmp + ".old"
		if err := os.Rename(dir, old); err != nil {
			return err
		}
		defer os.RemoveAll(old)
	}
	return os.Rename(tmp, dir)
}

func (c *Catalog) record(ctx context.Context, t *storage.Template, rootfs string) error {
	created, _ := time.Parse(time.RFC3339, t.CreatedAt)
	return c.store.PutTemplate(ctx, &store.TemplateRecord{
		Name: t.Name, Source: t.Source, Digest: t.Digest, SizeBytes: t.SizeBytes, CreatedAt: created,
	})
}

// SweepTemp removes leftovers of interrupted imports (".tmp-*" directories).
func (c *Catalog) SweepTemp() {
	entries, _ := os.ReadDir(c.layout.Templates())
	for _, e := range entries {
		if len(e.Name()) > 5 && e.Name()[:5] == ".tmp-" {
			_ = os.RemoveAll(filepath.Join(c.layout.Templates(), e.Name()))
		}
	}
}
