package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon"
	"github.com/forkbox/forkbox/datadir"
)

// TestMergeSurvivesDaemonKill kills the daemon (SIGKILL) while a merge of
// 2000 files is being applied and proves the next daemon leaves the
// session either untouched or fully merged (its start-up replays or rolls
// back the journal), with no journal left and the session running.
func TestMergeSurvivesDaemonKill(t *testing.T) {
	need(t)
	tmp, err := os.MkdirTemp("", "forkbox-merge-crash-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(tmp, 0o711)
	data := filepath.Join(tmp, "data")
	var live *serveProc
	t.Cleanup(func() {
		if live == nil {
			live, _ = startServe(t, data, "--storage-size", "4")
		}
		if live != nil {
			live.stop()
		}
		_ = daemon.ReleaseStorage(data)
		os.RemoveAll(datadir.Layout{Root: data}.Scratch())
		os.RemoveAll(tmp)
	})
	live, err = startServe(t, data, "--storage-size", "4")
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxFor(t, 10*time.Minute)
	parent, _, err := live.c.CreateSession(ctx, client.CreateRequest{DiskMB: 256}, "")
	if err != nil {
		t.Fatal(err)
	}
	const files = 2000
	mustExec := func(id, cmd string) string {
		t.Helper()
		out, err := live.c.ExecCollect(ctx, id, client.ExecRequest{Cmd: cmd, TimeoutS: 300})
		if err != nil || out.ExitCode != 0 {
			t.Fatalf("%q: %+v %v", cmd, out, err)
		}
		return string(out.Stdout)
	}
	mustExec(parent.ID, `mkdir -p /home/user/w && cd /home/user/w && i=0; while [ $i -lt 2000 ]; do echo base > f$i; i=$((i+1)); done`)
	snap, err := live.c.Snapshot(ctx, parent.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	fr, err := live.c.ForkSnapshot(ctx, snap.ID, client.ForkRequest{Count: 1, CreateRequest: client.CreateRequest{DiskMB: 256}})
	if err != nil {
		t.Fatal(err)
	}
	child := fr.Sessions[0].ID
	mustExec(child, `cd /home/user/w && for f in f*; do echo merged > $f; done`)

	journal := filepath.Join(datadir.Layout{Root: data}.Merges(), parent.ID, "journal.json")
	answered := make(chan error, 1)
	go func() {
		_, err := live.c.Merge(ctx, parent.ID, client.MergeRequest{From: child})
		answered <- err
	}()
	crashed := false
	for !crashed {
		select {
		case err := <-answered:
			t.Logf("the merge answered before the kill (%v): the check below still holds", err)
		case <-time.After(time.Millisecond):
			if _, err := os.Stat(journal); err == nil {
				live.kill()
				live, crashed = nil, true
			}
			continue
		}
		break
	}
	if crashed {
		if live, err = startServe(t, data, "--storage-size", "4"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Dir(journal)); !os.IsNotExist(err) {
			t.Fatalf("the merge's journal is still there after the restart: %v", err)
		}
	}
	out := mustExec(parent.ID, `cd /home/user/w && cat f* | sort | uniq -c`)
	fields := strings.Fields(out)
	if len(fields) != 2 || fields[0] != "2000" || (fields[1] != "base" && fields[1] != "merged") {
		t.Fatalf("after the crash the parent's %d files hold %q: neither untouched nor fully merged", files, out)
	}
	t.Logf("crashed mid-merge: %v; the parent's files are all %q", crashed, fields[1])
}
