package agent

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"math/rand"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/internal/envdpb/filesystempb"
)

// userXattrs reports whether dir's filesystem accepts user.* xattrs.
func userXattrs(dir string) bool {
	p := filepath.Join(dir, ".xattr-probe")
	defer os.Remove(p)
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		return false
	}
	return unix.Setxattr(p, "user.probe", []byte("1"), 0) == nil
}

// ownerOf returns the uid and gid of p (not following a symlink).
func ownerOf(t *testing.T, p string) (uint32, uint32) {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return st.Uid, st.Gid
}

// filesURL returns srv's /files URL with the query parameters kv (name, value, ...).
func filesURL(base string, kv ...string) string {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	return base + "/files?" + q.Encode()
}

// multipartBody encodes files (destination path -> content) as parts named
// "file", in the order of names, and returns the body and its content type.
func multipartBody(t *testing.T, names []string, files map[string]string) (*bytes.Buffer, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, n := range names {
		fw, err := mw.CreateFormFile("file", n)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(fw, files[n])
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf, mw.FormDataContentType()
}

// post sends body to u with content type ct (and extra headers kv) and
// returns the status and body.
func post(t *testing.T, u, ct string, body io.Reader, kv ...string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, u, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", ct)
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// wantFile fails t unless p holds content.
func wantFile(t *testing.T, p, content string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != content {
		t.Fatalf("%s = %q, want %q", p, b, content)
	}
}

// wantJSONError fails t unless status and body are a JSON error with code.
func wantJSONError(t *testing.T, status int, body []byte, code int) {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if status != code || json.Unmarshal(body, &e) != nil || e.Code != code || e.Message == "" {
		t.Fatalf("want JSON error %d, got %d %s", code, status, body)
	}
}

// TestUploadMultipart checks single and multi-file multipart uploads (paths
// with spaces and non-ASCII), the reply, mode 0644 and refused requests.
func TestUploadMultipart(t *testing.T) {
	requireRoot(t)
	srv, _ := newTestAgent(t)
	root := t.TempDir()

	single := filepath.Join(root, "one.txt")
	body, ct := multipartBody(t, []string{"ignored-name"}, map[string]string{"ignored-name": "one"})
	status, resp := post(t, filesURL(srv.URL, "path", single), ct, body)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, resp)
	}
	var got []uploadedFile
	if err := json.Unmarshal(resp, &got); err != nil || len(got) != 1 || got[0] != (uploadedFile{Path: single, Name: "one.txt", Type: "file"}) {
		t.Fatalf("reply %s", resp)
	}
	wantFile(t, single, "one")
	if fi, _ := os.Stat(single); fi.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v", fi.Mode())
	}

	a := filepath.Join(root, "dir with space", "ünïcødé.txt")
	b := filepath.Join(root, "nested", "deeper", "b.bin")
	files := map[string]string{a: "unicode content", b: "\x00\x01binary"}
	body, ct = multipartBody(t, []string{a, b}, files)
	status, resp = post(t, filesURL(srv.URL), ct, body)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, resp)
	}
	got = nil
	if err := json.Unmarshal(resp, &got); err != nil || len(got) != 2 || got[0].Path != a || got[0].Name != "ünïcødé.txt" || got[1].Path != b {
		t.Fatalf("reply %s", resp)
	}
	for p, c := range files {
		wantFile(t, p, c)
	}
	// Duplicate destinations and a path parameter with several parts are refused.
	body, ct = multipartBody(t, []string{a, a}, files)
	status, resp = post(t, filesURL(srv.URL), ct, body)
	wantJSONError(t, status, resp, http.StatusBadRequest)
	body, ct = multipartBody(t, []string{a, b}, files)
	status, resp = post(t, filesURL(srv.URL, "path", single), ct, body)
	wantJSONError(t, status, resp, http.StatusBadRequest)
	body, ct = multipartBody(t, []string{}, nil)
	status, resp = post(t, filesURL(srv.URL), ct, body)
	wantJSONError(t, status, resp, http.StatusBadRequest)
	// No temporary files are left behind.
	ents, _ := os.ReadDir(filepath.Dir(a))
	if len(ents) != 1 {
		t.Fatalf("leftovers in %s: %v", filepath.Dir(a), ents)
	}
}

// TestUploadOctetStreamGzipAndOwnership checks raw and gzip bodies, a kept
// mode on replace, chown to a numeric user, X-Metadata xattrs and errors.
func TestUploadOctetStreamGzipAndOwnership(t *testing.T) {
	requireRoot(t)
	srv, _ := newTestAgent(t)
	root := t.TempDir()

	p := filepath.Join(root, "raw.txt")
	status, resp := post(t, filesURL(srv.URL, "path", p), "application/octet-stream", strings.NewReader("raw body"))
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, resp)
	}
	wantFile(t, p, "raw body")

	// Replacing keeps the mode of the existing file.
	if err := os.Chmod(p, 0o600); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, "compressed body")
	zw.Close()
	status, resp = post(t, filesURL(srv.URL, "path", p), "application/octet-stream", &gz, "Content-Encoding", "gzip")
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, resp)
	}
	wantFile(t, p, "compressed body")
	if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, want kept 0600", fi.Mode())
	}

	owned := filepath.Join(root, "u", "v", "owned.txt")
	status, resp = post(t, filesURL(srv.URL, "path", owned, "username", "1000"), "application/octet-stream",
		strings.NewReader("mine"), "X-Metadata-Project-Id", "42")
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, resp)
	}
	for _, q := range []string{"u", "u/v", "u/v/owned.txt"} {
		if uid, gid := ownerOf(t, filepath.Join(root, q)); uid != 1000 || gid != 1000 {
			t.Fatalf("%s owned by %d:%d", q, uid, gid)
		}
	}
	if userXattrs(root) {
		buf := make([]byte, 64)
		n, err := unix.Getxattr(owned, "user.e2b.project-id", buf)
		if err != nil || string(buf[:n]) != "42" {
			t.Fatalf("metadata xattr: %q %v", buf[:n], err)
		}
	} else {
		t.Log("temp filesystem has no user xattrs; metadata not checked")
	}

	status, resp = post(t, filesURL(srv.URL, "path", p, "username", "no-such-user-xyz"), "application/octet-stream", strings.NewReader("x"))
	wantJSONError(t, status, resp, http.StatusUnauthorized)
	status, resp = post(t, filesURL(srv.URL), "application/octet-stream", strings.NewReader("x"))
	wantJSONError(t, status, resp, http.StatusBadRequest)
	status, resp = post(t, filesURL(srv.URL, "path", root), "application/octet-stream", strings.NewReader("x"))
	wantJSONError(t, status, resp, http.StatusBadRequest)
	status, resp = post(t, filesURL(srv.URL, "path", filepath.Join(p, "under-a-file")), "application/octet-stream", strings.NewReader("x"))
	wantJSONError(t, status, resp, http.StatusBadRequest)
}

// failingReader yields n bytes and then an error, like a client that dies.
type failingReader struct{ n int }

// Read returns zeros until n is used up, then an error.
func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, errors.New("client went away")
	}
	if len(p) > f.n {
		p = p[:f.n]
	}
	clear(p)
	f.n -= len(p)
	return len(p), nil
}

// TestUploadInterrupted checks that a broken upload leaves the destination
// unchanged and no temporary file behind.
func TestUploadInterrupted(t *testing.T) {
	requireRoot(t)
	a := New(wire.Config{DefaultUser: "root"}, slog.Default())
	h := a.Handler()
	handled := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		handled <- struct{}{}
	}))
	defer srv.Close()
	root := t.TempDir()
	p := filepath.Join(root, "keep.txt")
	if err := os.WriteFile(p, []byte("original"), 0o644); err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, filesURL(srv.URL, "path", p), &failingReader{n: 1 << 20})
	req.ContentLength = 10 << 20
	req.Header.Set("Content-Type", "application/octet-stream")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
	}
	select {
	case <-handled:
	case <-time.After(10 * time.Second):
		t.Fatal("upload handler did not finish")
	}
	if ents, _ := os.ReadDir(root); len(ents) != 1 {
		t.Fatalf("temporary file left: %v", ents)
	}
	wantFile(t, p, "original")
}

// TestDownload checks content and headers (Content-Length, also 0) and the
// JSON errors 404, 400 and 401.
func TestDownload(t *testing.T) {
	requireRoot(t)
	srv, _ := newTestAgent(t)
	root := t.TempDir()
	p := filepath.Join(root, "dir with space", "ünïcødé.txt")
	os.MkdirAll(filepath.Dir(p), 0o755)
	if err := os.WriteFile(p, []byte("hello ü"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(root, "empty")
	os.WriteFile(empty, nil, 0o644)

	get := func(u string) (*http.Response, []byte) {
		t.Helper()
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, b
	}
	resp, b := get(filesURL(srv.URL, "path", p))
	if resp.StatusCode != 200 || string(b) != "hello ü" || resp.Header.Get("Content-Length") != "8" ||
		resp.Header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("got %d %q %v", resp.StatusCode, b, resp.Header)
	}
	resp, b = get(filesURL(srv.URL, "path", empty))
	if resp.StatusCode != 200 || len(b) != 0 || resp.Header.Get("Content-Length") != "0" {
		t.Fatalf("empty: got %d %q %v", resp.StatusCode, b, resp.Header)
	}
	resp, b = get(filesURL(srv.URL, "path", filepath.Join(root, "missing")))
	wantJSONError(t, resp.StatusCode, b, http.StatusNotFound)
	if resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("error content type %q", resp.Header.Get("Content-Type"))
	}
	resp, b = get(filesURL(srv.URL, "path", root))
	wantJSONError(t, resp.StatusCode, b, http.StatusBadRequest)
	resp, b = get(filesURL(srv.URL, "path", p, "username", "no-such-user-xyz"))
	wantJSONError(t, resp.StatusCode, b, http.StatusUnauthorized)
	resp, b = get(filesURL(srv.URL))
	wantJSONError(t, resp.StatusCode, b, http.StatusBadRequest)
}

// TestLargeFileRoundTrip streams 50 MB up (multipart through a pipe) and
// down and compares hashes.
func TestLargeFileRoundTrip(t *testing.T) {
	requireRoot(t)
	srv, _ := newTestAgent(t)
	p := filepath.Join(t.TempDir(), "big.bin")
	const size = 50 << 20
	src := io.LimitReader(rand.New(rand.NewSource(1)), size)
	h := sha256.New()
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		fw, err := mw.CreateFormFile("file", p)
		if err == nil {
			_, err = io.Copy(io.MultiWriter(fw, h), src)
		}
		if err == nil {
			err = mw.Close()
		}
		pw.CloseWithError(err)
	}()
	status, resp := post(t, filesURL(srv.URL), mw.FormDataContentType(), pr)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, resp)
	}
	want := h.Sum(nil)

	dl, err := http.Get(filesURL(srv.URL, "path", p))
	if err != nil {
		t.Fatal(err)
	}
	defer dl.Body.Close()
	if dl.ContentLength != size {
		t.Fatalf("Content-Length %d", dl.ContentLength)
	}
	h2 := sha256.New()
	if n, err := io.Copy(h2, dl.Body); err != nil || n != size {
		t.Fatalf("downloaded %d bytes: %v", n, err)
	}
	if !bytes.Equal(h2.Sum(nil), want) {
		t.Fatal("downloaded content differs")
	}
}

// TestRelativePaths checks that relative paths start at the user's home for
// both /files and the RPCs.
func TestRelativePaths(t *testing.T) {
	requireRoot(t)
	// A numeric user missing from /etc/passwd gets home "/", so a relative
	// path names a file below / (here: inside the test's temp dir).
	if _, err := user.LookupId("54321"); err == nil {
		t.Skip("uid 54321 exists on this host")
	}
	srv, c := newTestAgent(t)
	root := t.TempDir()
	rel := strings.TrimPrefix(filepath.Join(root, "rel dir", "f.txt"), "/")
	status, resp := post(t, filesURL(srv.URL, "path", rel, "username", "54321"), "application/octet-stream", strings.NewReader("rel"))
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, resp)
	}
	wantFile(t, "/"+rel, "rel")
	if uid, gid := ownerOf(t, "/"+rel); uid != 54321 || gid != 54321 {
		t.Fatalf("owned by %d:%d", uid, gid)
	}
	st, err := c.Stat(context.Background(), asUser(&filesystempb.StatRequest{Path: rel}, "54321"))
	if err != nil {
		t.Fatal(err)
	}
	if e := st.Msg.GetEntry(); e.GetPath() != "/"+rel || e.GetOwner() != "54321" || e.GetSize() != 3 {
		t.Fatalf("bad entry %v", e)
	}
}

// TestDownloadGeneratedFiles proves files whose stat size is not their
// length are read to EOF: /proc files (size 0), a sysfs attribute (size
// 4096, a few bytes long) and a /proc file longer than one chunk (sent
// chunked); an unreadable one (/proc/self/mem at offset 0: EIO) is a JSON
// 500, not a torn or empty 200.
func TestDownloadGeneratedFiles(t *testing.T) {
	requireRoot(t)
	srv, _ := newTestAgent(t)
	get := func(p string) (*http.Response, []byte) {
		t.Helper()
		resp, err := http.Get(filesURL(srv.URL, "path", p))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("%s: reading the answer: %v", p, err)
		}
		return resp, b
	}
	for _, p := range []string{"/proc/self/environ", "/proc/self/cmdline", "/sys/devices/system/cpu/online", "/proc/kallsyms"} {
		want, err := os.ReadFile(p)
		if err != nil || len(want) == 0 {
			t.Logf("%s: not readable here (%v), skipped", p, err)
			continue
		}
		resp, b := get(p)
		if resp.StatusCode != 200 || !bytes.Equal(b, want) {
			t.Errorf("%s: %d, %d bytes, want 200 with the %d bytes a read to EOF gives", p, resp.StatusCode, len(b), len(want))
		}
		if len(want) < streamChunk && resp.Header.Get("Content-Length") != strconv.Itoa(len(want)) {
			t.Errorf("%s: Content-Length %q, want %d", p, resp.Header.Get("Content-Length"), len(want))
		}
		if len(want) > streamChunk && resp.ContentLength != -1 {
			t.Errorf("%s (%d bytes): Content-Length %d, want a chunked answer", p, len(want), resp.ContentLength)
		}
	}
	resp, b := get("/proc/self/mem")
	wantJSONError(t, resp.StatusCode, b, http.StatusInternalServerError)
}
