package guest

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest/wire"
)

// TestFiles: upload, stat, list, make, move, download and remove a file
// through the agent, and the agent's refusals classified.
func TestFiles(t *testing.T) {
	a, c := startAgent(t)
	ctx := guard(t)
	p := filepath.Join(a.dir, "d", "f.txt")
	written, err := c.Upload(ctx, p, "root", strings.NewReader("hello"), 5)
	if err != nil || written != p {
		t.Fatalf("upload: %q %v", written, err)
	}
	if b, err := os.ReadFile(p); err != nil || string(b) != "hello" {
		t.Fatalf("uploaded file holds %q (%v)", b, err)
	}
	e, err := c.Stat(ctx, p, "root")
	if err != nil || e.Type != "file" || e.Size != 5 || e.Name != "f.txt" || e.Path != p {
		t.Fatalf("stat: %+v %v", e, err)
	}
	if _, err := c.MakeDir(ctx, filepath.Join(a.dir, "d", "sub"), "root"); err != nil {
		t.Fatal(err)
	}
	_, err = c.MakeDir(ctx, filepath.Join(a.dir, "d", "sub"), "root")
	if !errors.Is(Classify(ctx, err, ""), errdefs.ErrConflict) {
		t.Fatalf("make an existing dir: %v", err)
	}
	list, err := c.ListDir(ctx, filepath.Join(a.dir, "d"), "root", 1)
	if err != nil || len(list) != 2 {
		t.Fatalf("list: %+v %v", list, err)
	}
	types := map[string]string{}
	for _, e := range list {
		types[e.Name] = e.Type
	}
	if types["f.txt"] != "file" || types["sub"] != "dir" {
		t.Fatalf("list types %v", types)
	}
	moved := filepath.Join(a.dir, "d", "sub", "g.txt")
	if e, err := c.Move(ctx, p, moved, "root"); err != nil || e.Path != moved {
		t.Fatalf("move: %+v %v", e, err)
	}
	rc, size, err := c.Download(ctx, moved, "root")
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(b) != "hello" || size != 5 {
		t.Fatalf("download: %q size %d %v", b, size, err)
	}
	if err := c.Remove(ctx, filepath.Join(a.dir, "d"), "root"); err != nil {
		t.Fatal(err)
	}
	_, err = c.Stat(ctx, moved, "root")
	if ce := Classify(ctx, err, ""); !errors.Is(ce, errdefs.ErrNotFound) {
		t.Fatalf("stat a removed file: %v", ce)
	}
	if ce := Classify(ctx, err, "path"); errdefs.Field(ce) != "path" {
		t.Fatalf("not found with a field: %v", ce)
	}

	// /files answers come classified: a missing file, an unknown user.
	_, _, err = c.Download(ctx, moved, "root")
	if k, ok := KindOf(err); !ok || k != Refused || !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("download a removed file: %v (%s)", err, k)
	}
	_, err = c.Upload(ctx, p, "no-such-user", strings.NewReader("x"), 1)
	if errdefs.Field(err) != "user" {
		t.Fatalf("upload as an unknown user: %v", err)
	}
	_, err = c.Stat(ctx, p, "no-such-user")
	if errdefs.Field(Classify(ctx, err, "")) != "user" {
		t.Fatalf("stat as an unknown user: %v", err)
	}
}

// TestInit: the agent takes new defaults; later processes get them.
func TestInit(t *testing.T) {
	a, c := startAgent(t)
	ctx := guard(t)
	sub := filepath.Join(a.dir, "work")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := c.Init(ctx, wire.InitRequest{EnvVars: map[string]string{"GREETING": "hi"}, DefaultUser: "root", DefaultWorkdir: sub}); err != nil {
		t.Fatal(err)
	}
	o := sh(`echo "$GREETING $(pwd)"`)
	o.User = ""
	if _, out, _ := run(t, c, o); out.stdout.String() != "hi "+sub+"\n" {
		t.Fatalf("after init: %q", out.stdout.String())
	}
}

// TestAnswerBound: an answer over MaxMessage (a listing the sandbox made
// huge) is refused with ErrResourceExhausted instead of being read whole.
func TestAnswerBound(t *testing.T) {
	a, c := startAgent(t)
	ctx := guard(t)
	// Entries carry their full path: long paths make the listing large
	// with few files (about 4 KiB each).
	dir := a.dir
	for len(dir) < 3400 {
		dir = filepath.Join(dir, strings.Repeat("d", 200))
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const files = MaxMessage / (4 << 10) * 5 / 4 // (a quarter over, for margin)
	for i := range files {
		name := fmt.Sprintf("%06d%s", i, strings.Repeat("f", 240))
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, err := c.ListDir(ctx, dir, "root", 1)
	ce := Classify(ctx, err, "path")
	if k, _ := KindOf(ce); k != Refused || !errors.Is(ce, errdefs.ErrResourceExhausted) {
		t.Fatalf("a listing over %d bytes: %v (%s)", MaxMessage, ce, k)
	}
	// The same directory with fewer entries lists.
	if _, err := c.ListDir(ctx, filepath.Dir(dir), "root", 1); err != nil {
		t.Fatal(err)
	}
}
