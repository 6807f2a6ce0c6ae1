package template

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// TestPullLayerSizesOverflow proves a manifest whose layer sizes add up
// past int64 (a hostile registry's) is refused as too large before any
// layer is downloaded, not let through by a sum that wrapped negative.
func TestPullLayerSizesOverflow(t *testing.T) {
	cfg := []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}`)
	sum := func(b []byte) string { h := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(h[:]) }
	big := int64(math.MaxInt64/2 + 1)
	layers := ""
	for i := 0; i < 2; i++ {
		if i > 0 {
			layers += ","
		}
		layers += fmt.Sprintf(`{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","size":%d,"digest":"sha256:%s"}`,
			big, strings.Repeat(fmt.Sprint(i+1), 64))
	}
	manifest := []byte(fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",`+
		`"config":{"mediaType":"application/vnd.oci.image.config.v1+json","size":%d,"digest":"%s"},"layers":[%s]}`,
		len(cfg), sum(cfg), layers))
	if !json.Valid(manifest) {
		t.Fatal("bad test manifest")
	}
	var blobHits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v2/":
		case strings.HasPrefix(r.URL.Path, "/v2/img/manifests/"):
			w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
			w.Header().Set("Docker-Content-Digest", sum(manifest))
			_, _ = w.Write(manifest)
		case r.URL.Path == "/v2/img/blobs/"+sum(cfg):
			_, _ = w.Write(cfg)
		default:
			blobHits.Add(1)
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	c, _ := testCatalog(t, RegistryPolicy{})
	ref := strings.TrimPrefix(srv.URL, "http://") + "/img:latest"
	_, err := c.Pull(context.Background(), "", "huge", ref, PullOptions{AnyAddress: true, MaxBytes: 1 << 20, MaxBytesName: "the test's limit"})
	var te *errdefs.TypedError
	if !errors.As(err, &te) || te.Type != ProblemTemplateTooLarge {
		t.Fatalf("pull of layers whose sizes overflow: %v, want %s", err, ProblemTemplateTooLarge)
	}
	if n := blobHits.Load(); n != 0 {
		t.Fatalf("%d layer requests made for an image refused as too large", n)
	}
}

// TestFailedPullEvicts proves the layer cache keeps to its bound after a
// pull that fails once its layers are downloaded (here: a layer that is
// no gzip stream, so unpacking it fails): a hostile caller's failing
// pulls do not pile blobs up past it until someone's pull succeeds.
func TestFailedPullEvicts(t *testing.T) {
	blob := make([]byte, 2<<20) // over the test cache's 1 MiB bound
	for i := range blob {
		blob[i] = byte(i*7 + i>>8)
	}
	sum := func(b []byte) string { h := sha256.Sum256(b); return "sha256:" + hex.EncodeToString(h[:]) }
	cfg := []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":["` + sum(blob) + `"]}}`)
	manifest := []byte(fmt.Sprintf(`{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json",`+
		`"config":{"mediaType":"application/vnd.oci.image.config.v1+json","size":%d,"digest":"%s"},`+
		`"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","size":%d,"digest":"%s"}]}`,
		len(cfg), sum(cfg), len(blob), sum(blob)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/v2/":
		case strings.HasPrefix(r.URL.Path, "/v2/img/manifests/"):
			w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
			w.Header().Set("Docker-Content-Digest", sum(manifest))
			_, _ = w.Write(manifest)
		case r.URL.Path == "/v2/img/blobs/"+sum(cfg):
			_, _ = w.Write(cfg)
		case r.URL.Path == "/v2/img/blobs/"+sum(blob):
			_, _ = w.Write(blob)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	c, lc := testCatalog(t, RegistryPolicy{})
	ref := strings.TrimPrefix(srv.URL, "http://") + "/img:latest"
	if _, err := c.Pull(context.Background(), "", "bad", ref, PullOptions{AnyAddress: true}); err == nil {
		t.Fatal("a pull of a layer that is no gzip stream succeeded")
	}
	if n, _, err := lc.Usage(); err != nil || n > lc.MaxBytes() {
		t.Fatalf("after the failed pull the cache holds %d bytes (%v), over its bound of %d", n, err, lc.MaxBytes())
	}
}

// TestPullManifestTooLarge proves a manifest over maxManifestBytes is a
// registry error, whether its length is announced or it is streamed
// without one, and that no more of it is read than the bound (and a
// little buffering).
func TestPullManifestTooLarge(t *testing.T) {
	for _, announce := range []bool{true, false} {
		var served atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case r.URL.Path == "/v2/":
			case strings.HasPrefix(r.URL.Path, "/v2/img/manifests/"):
				w.Header().Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
				size := 64 << 20
				if announce {
					w.Header().Set("Content-Length", fmt.Sprint(size))
				}
				chunk := []byte(strings.Repeat(" ", 64<<10))
				for n := 0; n < size; n += len(chunk) {
					if _, err := w.Write(chunk); err != nil {
						return
					}
					served.Add(int64(len(chunk)))
				}
			default:
				http.NotFound(w, r)
			}
		}))
		c, _ := testCatalog(t, RegistryPolicy{})
		ref := strings.TrimPrefix(srv.URL, "http://") + "/img:latest"
		_, err := c.Pull(context.Background(), "", "huge", ref, PullOptions{AnyAddress: true})
		srv.Close()
		var te *errdefs.TypedError
		if !errors.As(err, &te) || te.Type != ProblemRegistryError || !strings.Contains(err.Error(), "larger than") {
			t.Fatalf("announce %v: pull of a 64 MiB manifest: %v, want %s", announce, err, ProblemRegistryError)
		}
		if n := served.Load(); n > 3*maxManifestBytes {
			t.Errorf("announce %v: %d bytes of the manifest were read", announce, n)
		}
	}
}
