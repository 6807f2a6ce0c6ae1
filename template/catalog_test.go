package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/store"
)

// TestSweepTempRemovesInterruptedUploads: an upload spool left by a daemon
// that died mid-upload (it can be gigabytes) is removed at the next start,
// like an interrupted import's directory; templates are kept.
func TestSweepTempRemovesInterruptedUploads(t *testing.T) {
	layout, err := datadir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir := layout.Templates()
	for _, d := range []string{".tmp-0123abcd/rootfs", "base/rootfs", "my.tpl/rootfs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o711); err != nil {
			t.Fatal(err)
		}
	}
	spool, err := os.CreateTemp(dir, UploadPattern)
	if err != nil {
		t.Fatal(err)
	}
	spool.Close()
	c := NewCatalog(layout, nil, storage.DefaultIDShift, nil, nil)
	c.SweepTemp()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if len(left) != 2 || left[0] != "base" || left[1] != "my.tpl" {
		t.Fatalf("after SweepTemp: %q, want only the templates", left)
	}
}

// TestCodeInterpreterAlias: the code interpreter's template name lists
// and reads as an alias of base (a real store and template.json), and
// can be neither imported over nor deleted.
func TestCodeInterpreterAlias(t *testing.T) {
	ctx := context.Background()
	layout, err := datadir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "db.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	base := &storage.Template{Name: storage.BaseTemplate, Source: "builtin", CreatedAt: "2026-01-01T00:00:00Z"}
	if err := os.MkdirAll(layout.Template(base.Name), 0o711); err != nil {
		t.Fatal(err)
	}
	if err := storage.SaveTemplate(layout.Template(base.Name), base); err != nil {
		t.Fatal(err)
	}
	if err := st.PutTemplate(ctx, &store.TemplateRecord{Name: base.Name, Source: base.Source, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	c := NewCatalog(layout, st, storage.DefaultIDShift, nil, nil)
	list, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Name != "base" || list[1].Name != storage.CodeInterpreterTemplate || list[1].AliasOf != "base" {
		t.Fatalf("List = %+v, want base and its alias", list)
	}
	got, err := c.Get(ctx, storage.CodeInterpreterTemplate)
	if err != nil || got.AliasOf != "base" || got.Source != "builtin" {
		t.Fatalf("Get(alias) = %+v, %v", got, err)
	}
	if err := c.CheckImportName(storage.CodeInterpreterTemplate); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("import over the alias: %v, want invalid", err)
	}
	if err := c.Delete(ctx, storage.CodeInterpreterTemplate); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("delete of the alias: %v, want conflict", err)
	}
	if target, ok := storage.TemplateAlias("base"); ok {
		t.Fatalf("base is an alias of %q", target)
	}
}
