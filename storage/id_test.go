package storage

import (
	"errors"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// TestValidID proves the storage id rule takes the ids forkbox makes and
// refuses what could leave its directory, hide as a temporary entry, or
// collide with a driver's metadata file.
func TestValidID(t *testing.T) {
	for _, id := range []string{"a", "abcdefghij0123456789", "base", "python-3.12", "my_tpl.v2", "S1", strings.Repeat("x", MaxIDLength)} {
		if err := ValidID("layer", id); err != nil {
			t.Errorf("ValidID(%q): %v", id, err)
		}
	}
	for _, id := range []string{"", ".", "..", "../x", "a/b", ".hidden", "-flag", "a b", "a\x00b", "x.json", "é",
		strings.Repeat("x", MaxIDLength+1)} {
		err := ValidID("snapshot", id)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "snapshot id") {
			t.Errorf("ValidID(%q) = %v; want invalid argument naming the snapshot id", id, err)
		}
	}
}

// TestTemplateNamesAreIDs proves every valid template name is a valid
// storage id, so a template the API accepts is one both drivers take.
func TestTemplateNamesAreIDs(t *testing.T) {
	for _, name := range []string{"base", "a", "py3.12", "x-y_z", strings.Repeat("a", 63)} {
		if !ValidTemplateName(name) {
			t.Fatalf("ValidTemplateName(%q) = false", name)
		}
		if err := ValidID("template", name); err != nil {
			t.Fatalf("template name %q: %v", name, err)
		}
	}
	if ValidTemplateName("x.json") {
		t.Fatal(`ValidTemplateName("x.json") = true; no driver can hold it`)
	}
}
