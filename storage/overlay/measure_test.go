package overlay

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/storage"
)

// TestMeasure times a snapshot of a layer holding 500 MB (reflinked and
// byte-copied), restores from it and layers from a template. It only
// runs with FORKBOX_OVERLAY_MEASURE=1 and reports in the log; it asserts
// nothing about the times.
func TestMeasure(t *testing.T) {
	if os.Getenv("FORKBOX_OVERLAY_MEASURE") != "1" {
		t.Skip("set FORKBOX_OVERLAY_MEASURE=1 to measure")
	}
	d, _ := newDriver(t)
	ctx := context.Background()
	rootfs := prepare(t, d, "big", storage.Source{Template: "t1"}, 0)
	buf := make([]byte, 1<<20)
	for i := range buf {
		buf[i] = byte(i * 7)
	}
	f, err := os.Create(filepath.Join(rootfs, "home/user/big"))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 500; i++ {
		if _, err := f.Write(buf); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	syncAndDrop := func(drop bool) {
		syscall.Sync()
		if drop {
			os.WriteFile("/proc/sys/vm/drop_caches", []byte("3\n"), 0)
		}
	}
	snap := func(name string, noReflink, drop bool) {
		syncAndDrop(drop)
		d.noReflink = noReflink
		start := time.Now()
		info, err := d.Snapshot(ctx, "big", name, nil)
		el := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("Snapshot of 500 MB, %s: %v (size %d bytes)", name, el.Round(time.Microsecond), info.SizeBytes)
	}
	snap("reflink", false, false)
	snap("reflink-cold", false, true)
	snap("bytecopy-cold", true, true)
	snap("bytecopy-warm", true, false)
	d.noReflink = false
	var total time.Duration
	for i := 0; i < 8; i++ {
		start := time.Now()
		prepare(t, d, fmt.Sprintf("fork%d", i), storage.Source{Snapshot: "reflink"}, 0)
		el := time.Since(start)
		total += el
		t.Logf("Prepare from snapshot #%d: %v", i+1, el.Round(time.Microsecond))
	}
	t.Logf("Prepare from snapshot x8: %v total, %v each", total.Round(time.Microsecond), (total / 8).Round(time.Microsecond))
	total = 0
	for i := 0; i < 8; i++ {
		start := time.Now()
		prepare(t, d, fmt.Sprintf("tpl%d", i), storage.Source{Template: "t1"}, 0)
		total += time.Since(start)
	}
	t.Logf("Prepare from a template: %v each (8 runs)", (total / 8).Round(time.Microsecond))
	total = 0
	for i := 0; i < 8; i++ {
		start := time.Now()
		prepare(t, d, fmt.Sprintf("lim%d", i), storage.Source{Template: "t1"}, 1<<30)
		total += time.Since(start)
	}
	t.Logf("Prepare from a template with a 1 GiB limit (project quotas %v): %v each (8 runs)", d.ProjectQuotas(), (total / 8).Round(time.Microsecond))
}
