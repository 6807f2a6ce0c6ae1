package loop

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestPreallocateReservesBlocks proves a preallocated image owns its
// blocks on the host (it is not sparse).
func TestPreallocateReservesBlocks(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 64 << 20
	if err := Preallocate(f, size); err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != size || st.Blocks*512 < size {
		t.Fatalf("size %d, allocated %d bytes; want %d of both", st.Size, st.Blocks*512, size)
	}
}
