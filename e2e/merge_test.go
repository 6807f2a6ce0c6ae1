package e2e

import (
	"errors"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// workChanges returns the changes of d under /home/user/w as "op path".
func workChanges(d *client.Diff) map[string]client.FileChange {
	out := map[string]client.FileChange{}
	for _, c := range d.Changes {
		if strings.HasPrefix(c.Path, "/home/user/w/") {
			out[c.Op+" "+c.Path] = c
		}
	}
	return out
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestForkDiffMerge forks three children from a snapshot, changes
// overlapping and disjoint files in them, diffs each against the
// snapshot, merges one into the parent cleanly, merges a disjoint line
// change of another by lines, sees the third conflict (409 listing the
// path, nothing changed) and merges it with "theirs"; another tenant's
// merge is 404 and a session with no common snapshot 400.
func TestForkDiffMerge(t *testing.T) {
	parent := newSession(t, client.CreateRequest{})
	sh(t, parent.ID, `mkdir -p /home/user/w/dir && cd /home/user/w && for i in 1 2 3 4 5 6 7 8 9 10; do echo line$i; done > shared.txt &&
		echo keep > keep.txt && echo bye > gone.txt && echo x > dir/x`)
	snap, err := env.c.Snapshot(ctxFor(t, time.Minute), parent.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	kids := forkAll(t, snap.ID, 3)
	c0, c1, c2 := kids[0].ID, kids[1].ID, kids[2].ID
	sh(t, c0, `cd /home/user/w && sed -i 's/^line1$/c0-line1/' shared.txt && echo zero > c0.txt && rm gone.txt &&
		ln -s /etc/passwd out && printf 'a\000b' > blob.bin`)
	sh(t, c1, `cd /home/user/w && sed -i 's/^line1$/c1-line1/' shared.txt && echo one > c1.txt && echo kept-by-c1 > keep.txt`)
	sh(t, c2, `cd /home/user/w && sed -i 's/^line10$/c2-line10/' shared.txt`)

	ctx := ctxFor(t, 5*time.Minute)
	d0, err := env.c.SessionDiff(ctx, c0, "", true)
	if err != nil {
		t.Fatal(err)
	}
	if d0.Base != snap.ID {
		t.Errorf("diff base %q, want the session's snapshot %s", d0.Base, snap.ID)
	}
	got := workChanges(d0)
	want := []string{"added /home/user/w/blob.bin", "added /home/user/w/c0.txt", "added /home/user/w/out",
		"deleted /home/user/w/gone.txt", "modified /home/user/w/shared.txt"}
	if !slices.Equal(keys(got), want) {
		t.Fatalf("c0's changes %v, want %v", keys(got), want)
	}
	if c := got["modified /home/user/w/shared.txt"]; !strings.Contains(c.Patch, "-line1\n+c0-line1\n") || c.Kind != "file" {
		t.Errorf("shared.txt change %+v", c)
	}
	if c := got["added /home/user/w/out"]; c.Kind != "symlink" || c.SymlinkTarget != "/etc/passwd" {
		t.Errorf("symlink change %+v", c)
	}
	if c := got["added /home/user/w/blob.bin"]; !c.Binary || c.Patch != "" || c.Size != 3 {
		t.Errorf("binary change %+v", c)
	}
	d1, err := env.c.SessionDiff(ctx, c1, snap.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	if k := keys(workChanges(d1)); !slices.Equal(k, []string{"added /home/user/w/c1.txt", "modified /home/user/w/keep.txt", "modified /home/user/w/shared.txt"}) {
		t.Errorf("c1's changes %v", k)
	}
	d2, err := env.c.SessionDiff(ctx, c2, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if k := keys(workChanges(d2)); !slices.Equal(k, []string{"modified /home/user/w/shared.txt"}) {
		t.Errorf("c2's changes %v", k)
	}
	// Between two snapshots: c0's snapshot against the forks' snapshot.
	s0, err := env.c.Snapshot(ctx, c0, 0)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := env.c.SnapshotDiff(ctx, s0.ID, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if k := keys(workChanges(ds)); ds.Base != snap.ID || !slices.Equal(k, want) {
		t.Errorf("snapshot diff base %s: %v, want %v", ds.Base, k, want)
	}

	// c0 into the parent: clean.
	m, err := env.c.Merge(ctx, parent.ID, client.MergeRequest{From: c0})
	if err != nil {
		t.Fatal(err)
	}
	if m.Base != snap.ID || len(m.Conflicts) != 0 {
		t.Errorf("merge %+v", m)
	}
	if got := sh(t, parent.ID, `cd /home/user/w && head -1 shared.txt && cat c0.txt && readlink out && ls gone.txt 2>&1 || true`); got != "c0-line1\nzero\n/etc/passwd\nls: cannot access 'gone.txt': No such file or directory\n" {
		t.Errorf("parent after merging c0: %q", got)
	}
	// c2 changed another line of shared.txt: merged by lines.
	m, err = env.c.Merge(ctx, parent.ID, client.MergeRequest{From: c2})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m.Merged, []string{"/home/user/w/shared.txt"}) {
		t.Errorf("merge of c2: merged %v", m.Merged)
	}
	if got := sh(t, parent.ID, `cd /home/user/w && head -1 shared.txt && tail -1 shared.txt`); got != "c0-line1\nc2-line10\n" {
		t.Errorf("parent after merging c2: %q", got)
	}
	// c1 changed line 1 too: a conflict, and nothing changes.
	_, err = env.c.Merge(ctx, parent.ID, client.MergeRequest{From: c1})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusConflict || !slices.Equal(ce.Paths, []string{"/home/user/w/shared.txt"}) {
		t.Fatalf("merge of c1: %v (%+v), want 409 listing shared.txt", err, ce)
	}
	if got := sh(t, parent.ID, `cd /home/user/w && cat keep.txt && ls c1.txt 2>/dev/null || true`); got != "keep\n" {
		t.Errorf("a refused merge changed the parent: %q", got)
	}
	m, err = env.c.Merge(ctx, parent.ID, client.MergeRequest{From: c1, OnConflict: "theirs"})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(m.Conflicts, []string{"/home/user/w/shared.txt"}) {
		t.Errorf("theirs merge conflicts %v", m.Conflicts)
	}
	if got := sh(t, parent.ID, `cd /home/user/w && head -1 shared.txt && tail -1 shared.txt && cat keep.txt c1.txt`); got != "c1-line1\nline10\nkept-by-c1\none\n" {
		t.Errorf("parent after merging c1 with theirs: %q", got)
	}

	// Another tenant cannot name these sessions; a session from a
	// template shares no snapshot with them.
	_, _, other := newTenant(t, env.c, "merge", client.TenantPolicy{})
	if _, err := other.Merge(ctx, parent.ID, client.MergeRequest{From: c1}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's merge: %v, want not found", err)
	}
	lone := newSession(t, client.CreateRequest{})
	if _, err := env.c.Merge(ctx, lone.ID, client.MergeRequest{From: c0}); !isFieldError(err, "from") || !strings.Contains(err.Error(), "share no snapshot") {
		t.Errorf("merge without a common snapshot: %v", err)
	}
	if _, err := env.c.Merge(ctx, parent.ID, client.MergeRequest{From: c1, Paths: []string{"/home/../etc"}}); !isFieldError(err, "paths") {
		t.Errorf("merge of a path with ..: %v", err)
	}
}

// TestForkRunKeepsBest forks 8 children that each print a random score,
// streams their results and keeps only the best one.
func TestForkRunKeepsBest(t *testing.T) {
	parent := newSession(t, client.CreateRequest{})
	snap, err := env.c.Snapshot(ctxFor(t, time.Minute), parent.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	var events []client.ForkEvent
	done, err := env.c.ForkRun(ctxFor(t, 5*time.Minute), snap.ID, client.ForkRequest{Count: 8,
		Run:   &client.ForkRun{Cmd: `echo "score: $(od -An -N4 -tu4 /dev/urandom | tr -d ' ')"; echo err >&2`, TimeoutS: 120},
		Keep:  "best",
		Score: &client.ForkScore{StdoutRegex: `score: (\d+)`}}, func(ev client.ForkEvent) { events = append(events, ev) })
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range done.Kept {
		t.Cleanup(func() { _ = env.c.DeleteSession(ctxFor(t, time.Minute), id) })
	}
	if len(events) != 8 {
		t.Fatalf("%d child events, want 8", len(events))
	}
	best := -1
	var bestScore float64
	for _, ev := range events {
		if ev.ExitCode != 0 || ev.Score == nil || ev.StderrTail != "err\n" || ev.Error != "" {
			t.Fatalf("child %+v", ev)
		}
		if best < 0 || *ev.Score > bestScore || *ev.Score == bestScore && ev.Index < best {
			best, bestScore = ev.Index, *ev.Score
		}
	}
	if done.Best == nil || *done.Best != best || len(done.Kept) != 1 || len(done.Destroyed) != 7 {
		t.Fatalf("done %+v, want child %d kept alone", done, best)
	}
	var bestID string
	for _, ev := range events {
		if ev.Index == best {
			bestID = ev.SessionID
		}
	}
	if done.Kept[0] != bestID {
		t.Fatalf("kept %s, want %s", done.Kept[0], bestID)
	}
	if s, err := env.c.GetSession(ctxFor(t, time.Minute), bestID); err != nil || s.State != "running" {
		t.Errorf("the kept child: %+v, %v", s, err)
	}
	for _, id := range done.Destroyed {
		s, err := env.c.GetSession(ctxFor(t, time.Minute), id)
		if err == nil && s.State == "running" {
			t.Errorf("child %s was not destroyed: %s", id, s.State)
		}
	}
	if _, err := env.c.ForkRun(ctxFor(t, time.Minute), snap.ID, client.ForkRequest{Count: 2,
		Run: &client.ForkRun{Cmd: "true"}, Keep: "best"}, nil); !isFieldError(err, "keep") {
		t.Errorf("keep best without a score: %v", err)
	}
}

// TestMergeRollsBackWhenDiskFull merges a child's changes that do not fit
// the parent's disk limit: the merge fails with 507 after it changed a
// first file, and rolls that back, so the parent is untouched.
func TestMergeRollsBackWhenDiskFull(t *testing.T) {
	parent := newSession(t, client.CreateRequest{DiskMB: 64})
	sh(t, parent.ID, `mkdir -p /home/user/w && echo base > /home/user/w/a.txt`)
	snap, err := env.c.Snapshot(ctxFor(t, time.Minute), parent.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	res, err := env.c.ForkSnapshot(ctxFor(t, 2*time.Minute), snap.ID, client.ForkRequest{Count: 1, CreateRequest: client.CreateRequest{DiskMB: 512}})
	if err != nil {
		t.Fatal(err)
	}
	child := res.Sessions[0].ID
	t.Cleanup(func() { _ = env.c.DeleteSession(ctxFor(t, time.Minute), child) })
	sh(t, child, `cd /home/user/w && echo changed > a.txt && head -c 150000000 /dev/urandom > big.bin`)
	_, err = env.c.Merge(ctxFor(t, 5*time.Minute), parent.ID, client.MergeRequest{From: child})
	if !errors.Is(err, errdefs.ErrInsufficientStorage) {
		t.Fatalf("merge past the disk limit: %v, want 507", err)
	}
	if got := sh(t, parent.ID, `cat /home/user/w/a.txt; ls /home/user/w`); got != "base\na.txt\n" {
		t.Fatalf("the failed merge left %q", got)
	}
}

// TestMergeNeverFollowsSandboxSymlinks: the target replaced a directory
// by a symlink to a host directory, and the source wrote a file in that
// directory. The merge is a conflict; resolved with "theirs" the symlink
// becomes a directory again inside the sandbox, and nothing is written
// where the link pointed on the host.
func TestMergeNeverFollowsSandboxSymlinks(t *testing.T) {
	hostDir := t.TempDir()
	parent := newSession(t, client.CreateRequest{})
	sh(t, parent.ID, `mkdir -p /home/user/w/d && echo x > /home/user/w/d/keep`)
	snap, err := env.c.Snapshot(ctxFor(t, time.Minute), parent.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	kid := forkAll(t, snap.ID, 1)[0].ID
	sh(t, kid, `echo pwned > /home/user/w/d/escape`)
	sh(t, parent.ID, `rm -r /home/user/w/d && ln -s `+hostDir+` /home/user/w/d`)
	_, err = env.c.Merge(ctxFor(t, time.Minute), parent.ID, client.MergeRequest{From: kid})
	var ce *client.Error
	if !errors.As(err, &ce) || ce.Status != http.StatusConflict || !slices.Contains(ce.Paths, "/home/user/w/d/escape") {
		t.Fatalf("merge into a symlinked directory: %v, want a conflict on d/escape", err)
	}
	if _, err := env.c.Merge(ctxFor(t, time.Minute), parent.ID, client.MergeRequest{From: kid, OnConflict: "theirs"}); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, parent.ID, `test -d /home/user/w/d && ! test -L /home/user/w/d && cat /home/user/w/d/escape`); got != "pwned\n" {
		t.Fatalf("parent after theirs: %q", got)
	}
	if ents, err := os.ReadDir(hostDir); err != nil || len(ents) != 0 {
		t.Fatalf("the merge wrote through the sandbox's symlink on the host: %v %v", ents, err)
	}
}
