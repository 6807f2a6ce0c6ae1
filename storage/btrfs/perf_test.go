package btrfs

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

// TestPerformance logs how long the driver's operations take; it asserts
// nothing. It runs only with FORKBOX_BTRFS_PERF=1 (it writes about 1 GB):
//
//	FORKBOX_BTRFS_PERF=1 go test -run Performance -v ./storage/btrfs/
func TestPerformance(t *testing.T) {
	if os.Getenv("FORKBOX_BTRFS_PERF") != "1" {
		t.Skip("set FORKBOX_BTRFS_PERF=1 to measure (writes about 1 GB)")
	}
	ctx := context.Background()
	timed := func(what string, f func() error) time.Duration {
		t.Helper()
		start := time.Now()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		el := time.Since(start)
		t.Logf("%-55s %8.2f ms", what, float64(el.Microseconds())/1000)
		return el
	}
	base := testDir(t)
	var d *Driver
	timed("New on a fresh directory (mkfs.btrfs, mount, quotas)", func() error {
		d = openDriver(t, filepath.Join(base, "fs"))
		return nil
	})
	timed("New again (finds the mount)", func() error {
		d2, err := New(ctx, Options{Dir: d.dir})
		if err == nil {
			d2.Close()
		}
		return err
	})
	rootfs := filepath.Join(base, "rootfs")
	makeRootfs(t, rootfs)
	timed("AddTemplate of a small rootfs", func() error { return d.AddTemplate(ctx, "t", rootfs, "v1") })
	if _, err := os.Stat("/usr/local/go/src"); err == nil {
		timed("AddTemplate of /usr/local/go/src (12.8k entries, 157 MB)", func() error {
			return d.AddTemplate(ctx, "go", "/usr/local/go/src", "v1")
		})
		timed("Prepare from that template", func() error {
			_, err := d.Prepare(ctx, "gol", storage.Source{Template: "go"}, 0)
			return err
		})
		timed("Snapshot of a layer of that template", func() error {
			_, err := d.Snapshot(ctx, "gol", "gos", nil)
			return err
		})
		timed("Verify of that snapshot", func() error { return d.Verify(ctx, "gos") })
	}

	for i := 0; i < 3; i++ {
		timed(fmt.Sprintf("Prepare from template #%d", i+1), func() error {
			_, err := d.Prepare(ctx, fmt.Sprintf("t%d", i), storage.Source{Template: "t"}, 1<<30)
			return err
		})
	}
	rootfs, err := d.Prepare(ctx, "big", storage.Source{Template: "t"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	timed("write 500 MB (5 files of 100 MB) and fsync", func() error {
		for i := 0; i < 5; i++ {
			if err := writeFile(filepath.Join(rootfs, fmt.Sprintf("home/user/f%d", i), ""), 100<<20, byte('a'+i)); err != nil {
				return err
			}
		}
		return nil
	})
	timed("sync(2) after the big files", func() error { syscall.Sync(); return nil })
	timed("Snapshot of the layer with 500 MB in 5 files (on disk)", func() error {
		_, err := d.Snapshot(ctx, "big", "s0", nil)
		return err
	})
	timed("many small files: 2000 files of 4 KiB in 20 dirs", func() error {
		for i := 0; i < 2000; i++ {
			p := filepath.Join(rootfs, fmt.Sprintf("home/user/small/%02d/%04d", i%20, i))
			os.MkdirAll(filepath.Dir(p), 0o755)
			if err := os.WriteFile(p, make([]byte, 4096), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	timed("sync(2) of everything", func() error { syscall.Sync(); return nil })
	var info storage.SnapshotInfo
	timed("Snapshot of it with 2000 small files more (on disk)", func() error {
		info, err = d.Snapshot(ctx, "big", "s1", nil)
		return err
	})
	t.Logf("  snapshot SizeBytes %d", info.SizeBytes)
	timed("  of which ManifestDigest of the snapshot", func() error {
		_, _, err := storage.ManifestDigest(ctx, d.snapPath("s1"), 0)
		return err
	})
	timed("  of which BTRFS_IOC_SYNC with nothing dirty", func() error {
		_, err := d.usageBytes(rootfs, true)
		return err
	})
	timed("Verify of the snapshot", func() error { return d.Verify(ctx, "s1") })
	for i := 0; i < 8; i++ {
		timed(fmt.Sprintf("Prepare from the snapshot (fork) #%d", i+1), func() error {
			_, err := d.Prepare(ctx, fmt.Sprintf("fork%d", i), storage.Source{Snapshot: "s1"}, 1<<30)
			return err
		})
	}
	if err := writeFile(filepath.Join(rootfs, "home/user/dirty"), 200<<20, 'd'); err != nil {
		t.Fatal(err)
	}
	timed("Snapshot with 200 MB fsynced since the last one", func() error {
		_, err := d.Snapshot(ctx, "big", "s2", nil)
		return err
	})
	f, _ := os.Create(filepath.Join(rootfs, "home/user/unsynced"))
	f.Write(make([]byte, 200<<20))
	f.Close()
	timed("Snapshot with 200 MB dirty in the page cache", func() error {
		_, err := d.Snapshot(ctx, "big", "s3", nil)
		return err
	})
	timed("Usage of a layer", func() error { _, err := d.Usage(ctx, "big"); return err })
	f, _ = os.Create(filepath.Join(rootfs, "home/user/other"))
	f.Write(make([]byte, 300<<20))
	f.Close()
	timed("Usage while another layer has 300 MB dirty", func() error { _, err := d.Usage(ctx, "fork1"); return err })
	timed("Snapshot of an idle layer while another has 300 MB dirty", func() error {
		_, err := d.Snapshot(ctx, "fork2", "s4", nil)
		return err
	})
	timed("Remove of the 900 MB layer", func() error { return d.Remove(ctx, "big") })
	timed("RemoveSnapshot", func() error { return d.RemoveSnapshot(ctx, "s3") })
}
