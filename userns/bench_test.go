package userns

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkCreate measures making one sandbox's user namespace (the
// holder process, the id map, the bind mount) and removing it.
func BenchmarkCreate(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	dir := b.TempDir()
	s := Slice{First: 1<<30 + 9*SliceSize}
	for i := 0; i < b.N; i++ {
		p := filepath.Join(dir, "user")
		if err := Create(context.Background(), NamespaceOptions{Owner: s, Map: Mapping{HostID: s.First, Size: SliceSize}, UserPath: p}); err != nil {
			b.Fatal(err)
		}
		if err := RemoveFile(p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkMapMount measures one id-mapped mount of a directory and its
// removal.
func BenchmarkMapMount(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	base := b.TempDir()
	if err := unix.Mount("tmpfs", base, "tmpfs", 0, "size=1m"); err != nil {
		b.Fatal(err)
	}
	defer unix.Unmount(base, unix.MNT_DETACH)
	src, dst := filepath.Join(base, "src"), filepath.Join(base, "dst")
	for _, d := range []string{src, dst} {
		if err := os.Mkdir(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < b.N; i++ {
		if err := MapMount(src, dst, 100000, 1<<30+9*SliceSize, SliceSize); err != nil {
			b.Fatal(err)
		}
		if err := Unmount(dst); err != nil {
			b.Fatal(err)
		}
	}
}
