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
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/image"
	"github.com/forkbox/forkbox/storage/layercache"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// Catalog manages templates. It is safe for concurrent use.
type Catalog struct {
	layout datadir.Layout
	store  *store.Store
	shift  storage.IDShift
	// guard runs the removal of a template's files only while no live
	// session uses it (set by the daemon; see NewCatalog).
	guard func(name string, remove func() error) error
	// storage is told about every template (AddTemplate), so that
	// sandboxes' layers can be built on it.
	storage storage.Driver

	// layers keeps pulled images' layers (nil: this catalog pulls
	// nothing; see UsePull); registry says which registries pulls reach.
	layers   *layercache.Cache
	registry RegistryPolicy

	mu sync.Mutex // serialises installs, deletes and base builds
	// making holds the names of imports and pulls under way.
	making map[string]bool
}

// NewCatalog returns the catalog over layout and st. guard, when not nil,
// is how Delete takes a template's files away: it calls remove only if no
// live session uses template name, keeps new sessions off it while remove
// runs, and returns ErrConflict otherwise (sandbox.Templates'
// RemoveTemplateIfUnused). drv is the storage driver sandboxes' layers
// live on; every template is added to it.
func NewCatalog(layout datadir.Layout, st *store.Store, shift storage.IDShift, guard func(name string, remove func() error) error, drv storage.Driver) *Catalog {
	return &Catalog{layout: layout, store: st, shift: shift, guard: guard, storage: drv}
}

// Register adds every recorded template to the storage driver (at
// start-up; a driver that has a template's version already does nothing,
// which is how a template whose only copy the driver holds is kept). It
// returns the templates it could not add because their only copy was
// held by a storage driver that does not have it (another driver than
// this daemon's, or a volume made anew): they stay recorded, and creates
// from them fail until they are deleted and imported again.
func (c *Catalog) Register(ctx context.Context) (unavailable []string, err error) {
	recs, err := c.store.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range recs {
		dir := c.layout.Template(r.Name)
		t, err := storage.LoadTemplate(dir)
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if t.Storage != "" && t.Storage != c.storage.Name() {
			unavailable = append(unavailable, t.Name)
			continue
		}
		err = c.storage.AddTemplate(ctx, t.Name, storage.RootFS(dir), version(t))
		if err != nil && t.Storage != "" {
			unavailable = append(unavailable, t.Name)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("template %s: %w", t.Name, err)
		}
	}
	return unavailable, nil
}

// version identifies a template's content for storage.Driver.AddTemplate.
func version(t *storage.Template) string { return t.CreatedAt + "/" + t.Digest }

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
	return c.record(ctx, t, storage.RootFS(dir), "")
}

// Import unpacks the image at src (an OCI layout directory, or a tarball
// from `docker save` or of an OCI layout) as template name, owned by
// ctx's caller's tenant (o.Shared: by nobody, visible to every tenant; for
// admin keys). o.Ref picks one image when src holds several; o.Source is
// what the template's Source says it came from (what the user gave: the
// uploaded file's name, the image reference; never a host path, which
// its viewers should not learn; "" for "upload"). The image's ENV,
// WORKDIR and USER become the template's (ImportOptions), and its
// ENTRYPOINT and CMD its start command when o.StartCmd. ErrConflict when
// name exists or another import of it is under way (names are global:
// another tenant's template holds the name too); ErrInvalidArgument for
// a bad name or image (the message names paths in the image only), a
// USER the image has no account for, or o.StartCmd for an image without
// a command; past o.MaxBytes the 413 template-too-large. The files every
// sandbox mounts over are made safe first (storage.PrepareMountTargets).
func (c *Catalog) Import(ctx context.Context, name, src string, o ImportOptions) (*storage.Template, error) {
	release, err := c.reserve(name)
	if err != nil {
		return nil, err
	}
	defer release()
	owner := tenancy.TenantOf(ctx, "")
	if o.Shared {
		owner = ""
	}
	return c.install(ctx, name, owner, o, func(rootfs string, shift image.IDShift) (*image.Image, error) {
		img, err := image.ImportWith(ctx, src, o.Ref, rootfs, shift, image.Limits{MaxBytes: o.MaxBytes})
		return img, tooLarge(err, o.MaxBytes, o.MaxBytesName)
	}, nil)
}

// reserve takes name for an import or pull under way until release is
// called (once): CheckImportName's errors, or ErrConflict when another
// holds it.
func (c *Catalog) reserve(name string) (release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.checkName(name); err != nil {
		return nil, err
	}
	if c.making == nil {
		c.making = map[string]bool{}
	}
	c.making[name] = true
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			delete(c.making, name)
			c.mu.Unlock()
		})
	}, nil
}

// install makes template name (owned by tenant; "" shared) in a fresh
// temporary directory: unpack writes the image's root filesystem at the
// path it is given (which does not exist yet) and returns what it found;
// then the user directories and mount targets are prepared, the image's
// config applied (applyConfig), edit (when not nil) adds to the metadata,
// and the template is renamed into place and recorded, under c.mu. On
// any error nothing of it is left. The caller holds name (reserve).
func (c *Catalog) install(ctx context.Context, name, tenant string, o ImportOptions,
	unpack func(rootfs string, shift image.IDShift) (*image.Image, error), edit func(*storage.Template)) (*storage.Template, error) {
	dir := c.layout.Template(name)
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
	// The root filesystem is built where it will stay: in the template's
	// directory, or, when the storage driver keeps its own copy of every
	// template (btrfs), on the driver's volume, which then holds the only
	// copy (it used to be stored on the host disk and again in the volume).
	rootfs := storage.RootFS(tmp)
	var held string
	if stager, isStager := c.storage.(storage.TemplateStager); isStager {
		stage, err := stager.StageTemplate(ctx)
		if err != nil {
			return nil, err
		}
		defer storage.RemoveTree(stage) // AddTemplate has taken what it needs by then
		rootfs, held = storage.RootFS(stage), c.storage.Name()
	}
	img, err := unpack(rootfs, image.IDShift{UIDBase: c.shift.UIDBase, GIDBase: c.shift.GIDBase, Size: c.shift.Size})
	if err != nil {
		return nil, err
	}
	if err := storage.PrepareUserDirs(rootfs, c.shift); err != nil {
		return nil, fmt.Errorf("prepare template: %w", err)
	}
	if err := storage.PrepareMountTargets(rootfs, c.shift); err != nil {
		return nil, fmt.Errorf("prepare template: %w", err)
	}
	t := &storage.Template{
		Name: name, Source: o.source(), Digest: img.Digest, Env: img.Env, Workdir: img.WorkingDir,
		SizeBytes: img.SizeBytes, CreatedAt: time.Now().UTC().Format(time.RFC3339), Storage: held,
		Layers: img.Layers,
	}
	if err := applyConfig(t, img, rootfs, o, c.shift.Size); err != nil {
		return nil, err
	}
	if edit != nil {
		edit(t)
	}
	if err := storage.SaveTemplate(tmp, t); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := os.Rename(tmp, dir); err != nil {
		return nil, err
	}
	ok = true
	if held == "" {
		rootfs = storage.RootFS(dir)
	}
	if err := c.record(ctx, t, rootfs, tenant); err != nil {
		// Leave no half-made template under the name (a retry can use it).
		_ = c.storage.RemoveTemplate(context.WithoutCancel(ctx), name)
		os.RemoveAll(dir)
		return nil, err
	}
	return t, nil
}

// CheckImportName says whether Import could take name now: ErrInvalidArgument
// for a bad or reserved name, ErrConflict when a template has it. Callers
// use it to refuse an upload before receiving it; Import checks again.
func (c *Catalog) CheckImportName(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checkName(name)
}

// checkName is CheckImportName under c.mu.
func (c *Catalog) checkName(name string) error {
	if c.making[name] {
		return errdefs.Newf(errdefs.ErrConflict, "template %q is being imported now; wait for it or pick another name", name)
	}
	if !storage.ValidTemplateName(name) {
		return errdefs.InvalidField("name", "must be 1-63 characters of [a-z0-9._-]")
	}
	if name == storage.BaseTemplate {
		return errdefs.InvalidField("name", "%q is the built-in template", name)
	}
	if target, ok := storage.TemplateAlias(name); ok {
		return errdefs.InvalidField("name", "%q is a built-in alias of template %q", name, target)
	}
	if _, err := os.Stat(c.layout.Template(name)); err == nil {
		return errdefs.Newf(errdefs.ErrConflict, "template %q exists; delete it first", name)
	}
	return nil
}

// Get returns template name's metadata; ErrNotFound when absent or
// another tenant's.
func (c *Catalog) Get(ctx context.Context, name string) (*storage.Template, error) {
	if target, ok := storage.TemplateAlias(name); ok {
		t, err := c.Get(ctx, target)
		if err != nil {
			return nil, err
		}
		return aliasOf(name, t), nil
	}
	if !storage.ValidTemplateName(name) {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "template %q", name)
	}
	rec, err := c.store.GetTemplate(ctx, name)
	if _, caller := tenancy.From(ctx); caller && (err != nil || !tenancy.Visible(ctx, rec.Tenant)) {
		// Another tenant's, or files without a record (a failed import):
		// not the caller's.
		return nil, errdefs.Newf(errdefs.ErrNotFound, "template %q", name)
	}
	return storage.LoadTemplate(c.layout.Template(name))
}

// List returns every template ctx's caller can see (shared ones and its
// tenant's), by name.
func (c *Catalog) List(ctx context.Context) ([]*storage.Template, error) {
	recs, err := c.store.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*storage.Template, 0, len(recs))
	for _, r := range recs {
		if !tenancy.Visible(ctx, r.Tenant) {
			continue
		}
		t, err := storage.LoadTemplate(c.layout.Template(r.Name))
		if errors.Is(err, errdefs.ErrNotFound) {
			continue // its directory is gone; Delete or a re-import fixes the row
		}
		if err != nil {
			return nil, err
		}
		out = append(out, t)
		if t.Name == storage.BaseTemplate {
			out = append(out, aliasOf(storage.CodeInterpreterTemplate, t))
		}
	}
	return out, nil
}

// aliasOf is template t as alias name lists it: t's metadata under name,
// with AliasOf naming t.
func aliasOf(name string, t *storage.Template) *storage.Template {
	a := *t
	a.Name, a.AliasOf = name, t.Name
	return &a
}

// Delete removes template name. The base template cannot be deleted, and
// a template that live sessions use is ErrConflict. Another tenant's is
// ErrNotFound; a shared one needs an admin caller (ErrPermissionDenied).
func (c *Catalog) Delete(ctx context.Context, name string) error {
	if _, alias := storage.TemplateAlias(name); alias || name == storage.BaseTemplate {
		return errdefs.Newf(errdefs.ErrConflict, "the built-in template %q cannot be deleted", name)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.Get(ctx, name); err != nil {
		return err
	}
	if rec, err := c.store.GetTemplate(ctx, name); err == nil && rec.Tenant == "" {
		if caller, ok := tenancy.From(ctx); ok && !caller.Admin {
			return errdefs.Newf(errdefs.ErrPermissionDenied, "template %q is shared: only an admin key can delete it", name)
		}
	}
	trash, err := c.tempDir()
	if err != nil {
		return err
	}
	if err := os.Remove(trash); err != nil {
		return err
	}
	remove := func() error { return os.Rename(c.layout.Template(name), trash) }
	if c.guard != nil {
		err = c.guard(name, remove)
	} else {
		err = remove()
	}
	if err != nil {
		return err
	}
	if err := c.store.DeleteTemplate(ctx, name); err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		return err
	}
	if err := os.RemoveAll(trash); err != nil {
		return err
	}
	if c.layers != nil {
		// Its layers may be unused now: the cache keeps them within its bound.
		_, _ = c.layers.Evict(context.WithoutCancel(ctx))
	}
	return nil
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

// record adds template t (whose rootfs is now in place) to the storage
// driver and the store.
func (c *Catalog) record(ctx context.Context, t *storage.Template, rootfs, tenant string) error {
	if err := c.storage.AddTemplate(ctx, t.Name, rootfs, version(t)); err != nil {
		return fmt.Errorf("template %s: %w", t.Name, err)
	}
	created, _ := time.Parse(time.RFC3339, t.CreatedAt)
	return c.store.PutTemplate(ctx, &store.TemplateRecord{
		Name: t.Name, Source: t.Source, Digest: t.Digest, SizeBytes: t.SizeBytes, CreatedAt: created, Tenant: tenant,
	})
}

// UploadPattern is the os.CreateTemp pattern of uploaded image tarballs
// spooled in the templates directory before Import.
const UploadPattern = ".upload-*.tar"

// SweepTemp removes leftovers of interrupted imports and deletes (".tmp-*"
// directories) and of uploads cut short by a crash (UploadPattern files,
// which can be gigabytes). Call it before serving.
func (c *Catalog) SweepTemp() {
	entries, _ := os.ReadDir(c.layout.Templates())
	for _, e := range entries {
		name := e.Name()
		upload, _ := filepath.Match(UploadPattern, name)
		if strings.HasPrefix(name, ".tmp-") || upload {
			_ = os.RemoveAll(filepath.Join(c.layout.Templates(), name))
		}
	}
}
