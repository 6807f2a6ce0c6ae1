package build

import (
	"errors"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// TestAddURLDotDot checks that a URL whose last path element is ".."
// (which would name the destination's parent) is a 400 before anything
// is downloaded, and that one ending in "/" still lands as index.html.
func TestAddURLDotDot(t *testing.T) {
	for _, u := range []string{"http://files.test/a/..", "http://files.test/%2e%2e"} {
		_, err := planAddOf(t, "FROM base\nADD "+u+" /opt/d/\n", nil, []string{"files.test:80"})
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "..") {
			t.Fatalf("ADD %s: %v, want a 400 before any download", u, err)
		}
	}
}
