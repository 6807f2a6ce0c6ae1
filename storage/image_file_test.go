package storage

import "testing"

// TestDefaultImageBytesBounds proves DefaultImageBytes stays within its
// bounds.
func TestDefaultImageBytesBounds(t *testing.T) {
	if d := DefaultImageBytes(t.TempDir()); d < 1<<30 || d > MaxImageBytes {
		t.Fatalf("DefaultImageBytes %d out of bounds", d)
	}
}
