package changes

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestPlanAndApply(t *testing.T) {
	base := map[string]string{"shared.txt": "1\n2\n3\n4\n5\n6\n7\n", "mine": "m", "theirs-only": "t", "gone/x": "x", "bin": "\x00a"}
	baseDir := tree(t, base)
	ours := map[string]string{"shared.txt": "one\n2\n3\n4\n5\n6\n7\n", "mine": "M", "theirs-only": "t", "gone/x": "x", "bin": "\x00b"}
	oursDir := tree(t, ours)
	theirs := map[string]string{"shared.txt": "1\n2\n3\n4\n5\n6\nseven\n", "mine": "m", "theirs-only": "T", "new/f": "n",
		"link": "->/etc/passwd", "bin": "\x00c"}
	theirsDir := tree(t, theirs)
	ctx := context.Background()

	plan, err := PlanMerge(ctx, open(t, baseDir), open(t, oursDir), open(t, theirsDir), nil, ResolveFail)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(plan.Conflicts, []string{"/bin"}) {
		t.Fatalf("conflicts %v, want [/bin]", plan.Conflicts)
	}
	plan, err = PlanMerge(ctx, open(t, baseDir), open(t, oursDir), open(t, theirsDir), nil, ResolveTheirs)
	if err != nil {
		t.Fatal(err)
	}
	target := open(t, oursDir)
	if err := Apply(ctx, target, open(t, theirsDir), plan.Ops, filepath.Join(t.TempDir(), "j")); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"shared.txt": "one\n2\n3\n4\n5\n6\nseven\n", "mine": "M", "theirs-only": "T", "new/f": "n", "bin": "\x00c"}
	for p, c := range want {
		b, err := os.ReadFile(filepath.Join(oursDir, p))
		if err != nil || string(b) != c {
			t.Errorf("%s = %q, %v; want %q", p, b, err, c)
		}
	}
	if _, err := os.Lstat(filepath.Join(oursDir, "gone")); !os.IsNotExist(err) {
		t.Errorf("gone/ is still there: %v", err)
	}
	if l, err := os.Readlink(filepath.Join(oursDir, "link")); err != nil || l != "/etc/passwd" {
		t.Errorf("link = %q, %v", l, err)
	}
}

// TestRecoverRollsBack: a journal left rolling back restores what the
// target held before.
func TestRecoverRollsBack(t *testing.T) {
	oursDir := tree(t, map[string]string{"a": "old"})
	theirsDir := tree(t, map[string]string{"a": "new", "b": "added"})
	dir := filepath.Join(t.TempDir(), "j")
	ops := []Op{{Path: "a", Action: ActWrite, Mode: 0o644, UID: uint32(os.Getuid()), GID: uint32(os.Getgid())},
		{Path: "b", Action: ActWrite, Mode: 0o644, UID: uint32(os.Getuid()), GID: uint32(os.Getgid())}}
	target := open(t, oursDir)
	if err := Apply(context.Background(), target, open(t, theirsDir), ops, dir); err != nil {
		t.Fatal(err)
	}
	// Re-stage the same ops to simulate a crash after they were applied,
	// with the journal switched to rolling back.
	j := &journal{State: stateRollback, Ops: ops}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(oursDir, "a"), []byte("old"), 0o644)
	os.Remove(filepath.Join(oursDir, "b"))
	if err := stage(target, open(t, theirsDir), j, dir); err != nil {
		t.Fatal(err)
	}
	for _, op := range j.Ops {
		if err := apply(target, dir, op); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeJournal(dir, j); err != nil {
		t.Fatal(err)
	}
	if err := Recover(target, dir); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(oursDir, "a")); string(b) != "old" {
		t.Errorf("a = %q after the roll back, want old", b)
	}
	if _, err := os.Lstat(filepath.Join(oursDir, "b")); !os.IsNotExist(err) {
		t.Errorf("b survived the roll back: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("journal dir left: %v", err)
	}
}
