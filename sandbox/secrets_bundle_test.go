package sandbox

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestTemplateBundleSpecialFile proves a trust bundle path that a
// snapshot's session turned into a FIFO is skipped at once, not opened and
// waited on: opening a FIFO for reading blocks until a writer comes, which
// would hang the create (and its daemon goroutine) for good.
func TestTemplateBundleSpecialFile(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, filepath.Dir(TrustBundle))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(root, TrustBundle)
	if err := syscall.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan []byte, 1)
	go func() { done <- templateBundle(root) }()
	select {
	case b := <-done:
		if len(b) != 0 {
			t.Fatalf("a FIFO's bundle: %q", b)
		}
	case <-time.After(20 * time.Second): // a hang, not a speed: the call never returns
		// Unblock the stuck open so the test process can end.
		if w, err := os.OpenFile(fifo, os.O_WRONLY, 0); err == nil {
			w.Close()
		}
		<-done
		t.Fatal("templateBundle blocked opening a FIFO at the trust bundle's path")
	}
	// A regular bundle is still read.
	os.Remove(fifo)
	if err := os.WriteFile(fifo, []byte("PEM"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b := templateBundle(root); string(b) != "PEM" {
		t.Fatalf("regular bundle: %q", b)
	}
}
