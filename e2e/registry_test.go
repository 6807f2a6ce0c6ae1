package e2e

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// testRegistry is a real OCI registry (go-containerregistry's
// pkg/registry) on loopback, in the test process. It counts the GETs of
// each blob, can require basic auth, and can serve chosen blobs with a
// byte flipped (a registry whose content does not match its digests).
type testRegistry struct {
	srv  *httptest.Server
	host string // 127.0.0.1:PORT
	reg  http.Handler

	mu      sync.Mutex
	gets    map[string]int // blob digest -> GETs
	heads   map[string]int // blob digest -> HEADs
	corrupt map[string]bool
	user    string // basic auth required when set
	pass    string
}

// newTestRegistry starts a registry that stops when the test ends.
func newTestRegistry(t *testing.T) *testRegistry {
	t.Helper()
	r := &testRegistry{reg: registry.New(registry.Logger(log.New(io.Discard, "", 0))),
		gets: map[string]int{}, heads: map[string]int{}, corrupt: map[string]bool{}}
	r.srv = httptest.NewServer(r)
	t.Cleanup(r.srv.Close)
	r.host = strings.TrimPrefix(r.srv.URL, "http://")
	return r
}

// ServeHTTP checks the credentials, counts blob requests and corrupts
// what it is told to, then serves the registry's answer.
func (r *testRegistry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	user, pass := r.user, r.pass
	var digest string
	if i := strings.Index(req.URL.Path, "/blobs/"); i >= 0 && strings.HasPrefix(req.URL.Path, "/v2/") {
		digest = req.URL.Path[i+len("/blobs/"):]
		switch req.Method {
		case http.MethodGet:
			r.gets[digest]++
		case http.MethodHead:
			r.heads[digest]++
		}
	}
	corrupt := req.Method == http.MethodGet && r.corrupt[digest]
	r.mu.Unlock()
	if user != "" {
		u, p, ok := req.BasicAuth()
		if !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="forkbox-test"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
			return
		}
	}
	if corrupt {
		w = &flipWriter{ResponseWriter: w}
	}
	r.reg.ServeHTTP(w, req)
}

// flipWriter flips the first byte of the body it writes.
type flipWriter struct {
	http.ResponseWriter
	flipped bool
}

func (f *flipWriter) Write(p []byte) (int, error) {
	if !f.flipped && len(p) > 0 {
		f.flipped = true
		q := bytes.Clone(p)
		q[0] ^= 0xff
		return f.ResponseWriter.Write(q)
	}
	return f.ResponseWriter.Write(p)
}

// requireAuth makes the registry answer only requests with these
// credentials.
func (r *testRegistry) requireAuth(user, pass string) {
	r.mu.Lock()
	r.user, r.pass = user, pass
	r.mu.Unlock()
}

// corruptBlob makes the registry serve blob d with a byte flipped.
func (r *testRegistry) corruptBlob(d v1.Hash) {
	r.mu.Lock()
	r.corrupt[d.String()] = true
	r.mu.Unlock()
}

// blobGets is how many GETs blob d had.
func (r *testRegistry) blobGets(d v1.Hash) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gets[d.String()]
}

// auth is remote's option with the registry's credentials, if any.
func (r *testRegistry) auth() remote.Option {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.user == "" {
		return remote.WithAuth(authn.Anonymous)
	}
	return remote.WithAuth(&authn.Basic{Username: r.user, Password: r.pass})
}

// push writes img to the registry as repoTag ("test/bb:1") and returns
// the reference to pull it by and its manifest digest.
func (r *testRegistry) push(t *testing.T, repoTag string, img v1.Image) (string, v1.Hash) {
	t.Helper()
	ref := r.host + "/" + repoTag
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img, r.auth()); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return ref, d
}

// pushIndex writes idx to the registry as repoTag.
func (r *testRegistry) pushIndex(t *testing.T, repoTag string, idx v1.ImageIndex) string {
	t.Helper()
	ref := r.host + "/" + repoTag
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(tag, idx, r.auth()); err != nil {
		t.Fatalf("push index %s: %v", ref, err)
	}
	return ref
}

// fileLayer is a layer of one regular file path holding body (its
// directories made), gzip-compressed as registries serve them.
func fileLayer(t *testing.T, path, body string) v1.Layer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	parts := strings.Split(path, "/")
	for i := range parts[:len(parts)-1] {
		tw.WriteHeader(&tar.Header{Name: strings.Join(parts[:i+1], "/") + "/", Typeflag: tar.TypeDir, Mode: 0o755})
	}
	tw.WriteHeader(&tar.Header{Name: path, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body)), ModTime: time.Unix(1e9, 0)})
	tw.Write([]byte(body))
	tw.Close()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// withLayers is img with layers added on top.
func withLayers(t *testing.T, img v1.Image, ls ...v1.Layer) v1.Image {
	t.Helper()
	out, err := mutate.AppendLayers(img, ls...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// digestOf is layer l's (compressed) digest.
func digestOf(t *testing.T, l v1.Layer) v1.Hash {
	t.Helper()
	d, err := l.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// uniq is a string no other test run uses (for layers no other test's
// registry serves).
func uniq(t *testing.T) string {
	return fmt.Sprintf("%s %d", t.Name(), time.Now().UnixNano())
}
