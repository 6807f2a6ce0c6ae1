package runtime

import (
	"strings"
	"testing"
)

// TestValidID: lowercase letters and digits, 1 to 63 of them; nothing
// that could be a path, an option or another cgroup.
func TestValidID(t *testing.T) {
	for _, id := range []string{"a", "0", "abc123", strings.Repeat("z", MaxIDLen)} {
		if !ValidID(id) {
			t.Errorf("%q refused", id)
		}
	}
	for _, id := range []string{"", strings.Repeat("z", MaxIDLen+1), "A", "a-b", "a_b", "a.b", "../x", "a/b",
		"-rf", "a b", "a\x00", "é"} {
		if ValidID(id) {
			t.Errorf("%q accepted", id)
		}
	}
}
