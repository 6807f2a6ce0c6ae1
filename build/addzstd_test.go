package build

import (
	"archive/tar"
	"bytes"
	"errors"
	"runtime"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/forkbox/forkbox/errdefs"
)

// TestAddZstdWindow checks that a zstd archive whose frame asks for a
// window past the zstd tool's default decoder limit (128 MiB) is a 400
// naming it, without the decoder taking that memory: a 1 KB file asking
// for 512 MiB made the daemon allocate 512 MiB per ADD.
func TestAddZstdWindow(t *testing.T) {
	var zs bytes.Buffer
	enc, err := zstd.NewWriter(&zs, zstd.WithWindowSize(1<<29), zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(enc)
	body := make([]byte, 8<<20)
	tw.WriteHeader(&tar.Header{Name: "f", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
	for off := 0; off < len(body); off += 1 << 20 {
		tw.Write(body[off : off+1<<20])
	}
	tw.Close()
	enc.Close()
	c := binContext(t, map[string][]byte{"a.tar.zst": zs.Bytes()})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err = planAddOf(t, "FROM base\nADD a.tar.zst /opt/\n", c, nil)
	runtime.ReadMemStats(&after)
	if grew := (after.TotalAlloc - before.TotalAlloc) >> 20; grew > 200 {
		t.Errorf("ADD of a %d-byte zstd archive allocated %d MiB", zs.Len(), grew)
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "window") {
		t.Fatalf("ADD of a zstd archive with a 512 MiB window: %v, want a 400 naming the window", err)
	}
}
