package e2e

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestTemplateImportStoredOnce proves an imported template's files are
// stored once in the data directory: on btrfs only in the storage volume
// (they were also kept on the host disk under templates/), on overlay only
// under templates/ (which overlay uses in place). The template works, and
// still works after a daemon restart (which re-adds every template), and
// deleting it leaves no copy.
func TestTemplateImportStoredOnce(t *testing.T) {
	img := busyboxImage(t)
	o := newOwnDaemon(t)
	ctx := ctxFor(t, 3*time.Minute)
	if _, err := o.c.ImportTemplate(ctx, "once", "", bytes.NewReader(img), int64(len(img))); err != nil {
		t.Fatal(err)
	}
	copies := func() []string {
		t.Helper()
		var found []string
		filepath.WalkDir(o.dataDir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return nil
			}
			rel, _ := filepath.Rel(o.dataDir, p)
			if d.IsDir() && (rel == "sandboxes" || strings.HasSuffix(rel, "/layers") || strings.HasSuffix(rel, "/snapshots")) {
				return filepath.SkipDir
			}
			if strings.HasSuffix(rel, ".stage-") || strings.Contains(rel, "/.stage-") {
				found = append(found, rel+" (a staging leftover)")
			}
			if d.Type().IsRegular() && strings.HasSuffix(rel, "/etc/motd") {
				if b, err := os.ReadFile(p); err == nil && string(b) == "from the image\n" {
					found = append(found, rel)
				}
			}
			return nil
		})
		return found
	}
	if got := copies(); len(got) != 1 {
		t.Fatalf("after the import the template's /etc/motd is stored %d times: %v, want once", len(got), got)
	}
	check := func(when string) {
		t.Helper()
		s, _, err := o.c.CreateSession(ctx, client.CreateRequest{Template: "once"}, "")
		if err != nil {
			t.Fatalf("%s: create from the template: %v", when, err)
		}
		out, err := o.c.ExecCollect(ctx, s.ID, client.ExecRequest{Argv: []string{"cat", "/etc/motd"}})
		if err != nil || string(out.Stdout) != "from the image\n" {
			t.Fatalf("%s: the template's file in a session: %+v %v", when, out, err)
		}
		if err := o.c.DeleteSession(ctx, s.ID); err != nil {
			t.Fatal(err)
		}
	}
	check("after the import")
	o.restart(t, nil)
	check("after a restart")
	if got := copies(); len(got) != 1 {
		t.Fatalf("after a restart the template is stored %d times: %v, want once", len(got), got)
	}
	if err := o.c.DeleteTemplate(ctx, "once"); err != nil {
		t.Fatal(err)
	}
	if got := copies(); len(got) != 0 {
		t.Fatalf("after the delete the template is still stored: %v", got)
	}
}
