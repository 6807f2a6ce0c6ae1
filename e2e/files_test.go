package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// TestFilesLargeStreamed proves a large upload and download are streamed
// and arrive intact (sha256 on both sides and inside the sandbox).
func TestFilesLargeStreamed(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	const size = 96 << 20
	src := io.LimitReader(rand.Reader, size)
	h := sha256.New()
	e, err := env.c.Upload(ctxFor(t, 2*time.Minute), s.ID, "/home/user/big.bin", io.TeeReader(src, h), -1, "")
	if err != nil {
		t.Fatal(err)
	}
	want := h.Sum(nil)
	if e.Size != size || e.Owner != "user" {
		t.Fatalf("uploaded entry %+v", e)
	}
	inside := strings.Fields(sh(t, s.ID, "sha256sum /home/user/big.bin"))[0]
	if inside != hexOf(want) {
		t.Fatalf("sha256 inside the sandbox %s, uploaded %x", inside, want)
	}
	rc, err := env.c.Download(ctxFor(t, 2*time.Minute), s.ID, "/home/user/big.bin", "")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	h2 := sha256.New()
	n, err := io.Copy(h2, rc)
	if err != nil || n != size || !bytes.Equal(h2.Sum(nil), want) {
		t.Fatalf("download: %d bytes, err %v, sha256 match %v", n, err, bytes.Equal(h2.Sum(nil), want))
	}
}

func hexOf(b []byte) string {
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 2*len(b))
	for _, c := range b {
		out = append(out, digits[c>>4], digits[c&15])
	}
	return string(out)
}

// TestFilesNamesAndEmpty proves empty files and paths with spaces and
// non-ASCII characters round-trip, with parents created.
func TestFilesNamesAndEmpty(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	ctx := ctxFor(t, time.Minute)
	p := "/home/user/dir with space/ünïcødé ✓/file name.txt"
	if _, err := env.c.Upload(ctx, s.ID, p, strings.NewReader("content"), 7, ""); err != nil {
		t.Fatal(err)
	}
	if got := string(download(t, s.ID, p, "")); got != "content" {
		t.Fatalf("read back %q", got)
	}
	if out := sh(t, s.ID, "cat '"+p+"'"); out != "content" {
		t.Fatalf("inside the sandbox: %q", out)
	}
	e, err := env.c.Upload(ctx, s.ID, "/tmp/empty", bytes.NewReader(nil), 0, "")
	if err != nil || e.Size != 0 {
		t.Fatalf("empty upload: %+v %v", e, err)
	}
	if got := download(t, s.ID, "/tmp/empty", ""); len(got) != 0 {
		t.Fatalf("empty file read back %d bytes", len(got))
	}
}

// TestFilesOperations proves mkdir, list, stat, move and remove, and that
// files written through the API belong to the exec user.
func TestFilesOperations(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	ctx := ctxFor(t, time.Minute)
	if _, err := env.c.MakeDir(ctx, s.ID, "/home/user/a/b/c", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := env.c.MakeDir(ctx, s.ID, "/home/user/a/b/c", ""); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("mkdir of an existing dir: %v, want conflict", err)
	}
	if _, err := env.c.Upload(ctx, s.ID, "/home/user/a/f.txt", strings.NewReader("x"), 1, ""); err != nil {
		t.Fatal(err)
	}
	entries, err := env.c.ListDir(ctx, s.ID, "/home/user/a", 1, "")
	if err != nil || len(entries) != 2 {
		t.Fatalf("list: %+v %v", entries, err)
	}
	deep, _ := env.c.ListDir(ctx, s.ID, "/home/user/a", 3, "")
	if len(deep) != 3 {
		t.Errorf("list depth 3 gave %d entries, want 3 (b, b/c, f.txt)", len(deep))
	}
	st, err := env.c.Stat(ctx, s.ID, "/home/user/a/b", "")
	if err != nil || st.Type != "dir" || st.Owner != "user" {
		t.Errorf("stat dir: %+v %v", st, err)
	}
	mv, err := env.c.Move(ctx, s.ID, "/home/user/a/f.txt", "/home/user/moved/g.txt", "")
	if err != nil || mv.Path != "/home/user/moved/g.txt" {
		t.Fatalf("move: %+v %v", mv, err)
	}
	if _, err := env.c.Stat(ctx, s.ID, "/home/user/a/f.txt", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("moved source still there: %v", err)
	}
	e, err := env.c.Upload(ctx, s.ID, "/tmp/by-root.txt", strings.NewReader("r"), 1, "root")
	if err != nil || e.Owner != "root" {
		t.Errorf("upload as root: %+v %v", e, err)
	}
	if err := env.c.Remove(ctx, s.ID, "/home/user/a", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := env.c.Stat(ctx, s.ID, "/home/user/a", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("removed dir still there: %v", err)
	}
	if _, err := env.c.Download(ctx, s.ID, "/home/user/nope", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("download of a missing file: %v, want not found", err)
	}
	if _, err := env.c.Download(ctx, s.ID, "/home/user", ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("download of a directory: %v, want invalid argument", err)
	}
}

// TestFilesCannotReachHost proves paths resolve inside the sandbox: '..'
// cannot climb out, a symlink to a host path reads the sandbox's file (or
// nothing), and writes to read-only places fail without touching the host.
func TestFilesCannotReachHost(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	ctx := ctxFor(t, time.Minute)
	hostPasswd, _ := os.ReadFile("/etc/passwd")
	// '..' in a files URL is refused; in a path parameter it resolves inside
	// the sandbox's own root.
	if _, err := env.c.Download(ctx, s.ID, "/home/user/../../../../../etc/passwd", ""); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("'..' in a files URL: %v, want invalid argument", err)
	}
	st, err := env.c.Stat(ctx, s.ID, "/home/user/../../../../../etc/passwd", "")
	if err != nil || st.Path != "/etc/passwd" || st.Size == int64(len(hostPasswd)) {
		t.Errorf("stat through '..': %+v %v (host passwd is %d bytes)", st, err, len(hostPasswd))
	}
	// Symlinks made by sandbox code point into the sandbox's own tree.
	sh(t, s.ID, "ln -s /etc/shadow /home/user/shadow; ln -s ../../../../../../etc/passwd /home/user/pw; ln -s /proc/1/root/etc/hostname /home/user/hn")
	if _, err := env.c.Download(ctx, s.ID, "/home/user/shadow", ""); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("symlink to /etc/shadow: %v, want not found (no shadow in the sandbox)", err)
	}
	if got := download(t, s.ID, "/home/user/pw", ""); bytes.Equal(got, hostPasswd) {
		t.Errorf("symlink escaped to the host's passwd")
	}
	if got := strings.TrimSpace(string(download(t, s.ID, "/home/user/hn", ""))); got != s.ID {
		t.Errorf("symlink through /proc/1/root read %q, want the sandbox hostname", got)
	}
	// Writing through a symlink or to a read-only path fails and the host is untouched.
	before, _ := os.ReadFile("/etc/passwd")
	sh(t, s.ID, "ln -s /etc/passwd /home/user/evil")
	if _, err := env.c.Upload(ctx, s.ID, "/home/user/evil", strings.NewReader("pwned"), 5, "root"); err == nil {
		t.Errorf("upload through a symlink to /etc/passwd succeeded")
	}
	if _, err := env.c.Upload(ctx, s.ID, "/etc/passwd", strings.NewReader("pwned"), 5, "root"); err == nil {
		t.Errorf("upload to the read-only /etc succeeded")
	}
	after, _ := os.ReadFile("/etc/passwd")
	if !bytes.Equal(before, after) {
		t.Fatal("the host's /etc/passwd changed")
	}
}
