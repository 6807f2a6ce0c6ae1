package bench

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/forkbox/forkbox/client"
)

// GroupPull is the registry pull rows: a small image (a static busybox
// and 1 MiB of random data, two gzip layers) pulled into a template from
// a registry in the benchmark's own process (go-containerregistry's
// pkg/registry over loopback HTTP), with none of its layers held and then
// a second image with the same layers, beside `podman pull` of the same
// kind of images from the same registry.
const GroupPull = "pull"

// The pull rows' operations.
const (
	// OpPullCold is a pull whose layers no template or cache holds.
	OpPullCold = "pull: small image, no layer held"
	// OpPullCached is a pull of another image with the same layers,
	// right after: the layers are held (forkbox unpacks them again into
	// the new template; podman only fetches the manifest and config).
	OpPullCached = "pull: another image, layers held"
)

// pullRegistry is the in-process registry of the pull rows.
type pullRegistry struct {
	srv  *httptest.Server
	host string
	bb   []byte // the static busybox

	mu  sync.Mutex
	seq int
}

// openPullRegistry starts the registry; close stops it.
func openPullRegistry() (*pullRegistry, error) {
	bb, err := os.ReadFile(busyboxPath)
	if err != nil {
		return nil, fmt.Errorf("the pull rows need a static busybox (apt-get install busybox-static): %w", err)
	}
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	return &pullRegistry{srv: srv, host: strings.TrimPrefix(srv.URL, "http://"), bb: bb}, nil
}

func (r *pullRegistry) close() { r.srv.Close() }

// pushPair pushes two new images with the same two layers (new ones: no
// earlier pull holds them) and different configs, and returns their
// references.
func (r *pullRegistry) pushPair(ctx context.Context, who string) (cold, cached string, err error) {
	r.mu.Lock()
	r.seq++
	n := r.seq
	r.mu.Unlock()
	var base bytes.Buffer
	tw := tar.NewWriter(&base)
	tw.WriteHeader(&tar.Header{Name: "bin/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(r.bb))})
	tw.Write(r.bb)
	tw.WriteHeader(&tar.Header{Name: "bin/sh", Typeflag: tar.TypeSymlink, Linkname: "busybox"})
	mark := fmt.Appendf(nil, "%s %d %d\n", who, n, time.Now().UnixNano()) // a new layer digest every time
	tw.WriteHeader(&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "etc/bench", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(mark))})
	tw.Write(mark)
	tw.Close()
	data := make([]byte, 1<<20)
	rand.Read(data)
	var blob bytes.Buffer
	tw = tar.NewWriter(&blob)
	tw.WriteHeader(&tar.Header{Name: "data.bin", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(data))})
	tw.Write(data)
	tw.Close()
	var layers []v1.Layer
	for _, b := range [][]byte{base.Bytes(), blob.Bytes()} {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
		if err != nil {
			return "", "", err
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		return "", "", err
	}
	var refs []string
	for _, variant := range []string{"a", "b"} {
		im, err := mutate.Config(img, v1.Config{Env: []string{"PATH=/bin", "VARIANT=" + variant}})
		if err != nil {
			return "", "", err
		}
		ref := fmt.Sprintf("%s/bench/%s-%d:%s", r.host, who, n, variant)
		tag, err := name.NewTag(ref)
		if err != nil {
			return "", "", err
		}
		if err := remote.Write(tag, im, remote.WithContext(ctx)); err != nil {
			return "", "", fmt.Errorf("push %s: %w", ref, err)
		}
		refs = append(refs, ref)
	}
	return refs[0], refs[1], nil
}

// measurePull measures the pull rows (GroupPull): each round pushes a
// new pair of images (untimed), pulls the first (no layer held) and the
// second (its layers held) as templates, and deletes them (untimed);
// podman does the same with its own pair and removes its images.
func (e *env) measurePull(ctx context.Context) []Result {
	ops := []string{OpPullCold, OpPullCached}
	reg, err := openPullRegistry()
	if err != nil {
		return failOps(ops, SystemForkbox, err)
	}
	defer reg.close()
	f := e.fb
	fb := contender{system: SystemForkbox, step: func(ctx context.Context) ([]time.Duration, error) {
		cold, cached, err := reg.pushPair(ctx, "forkbox")
		if err != nil {
			return nil, err
		}
		var out []time.Duration
		for i, ref := range []string{cold, cached} {
			tpl := fmt.Sprintf("bench-pull-%s-%d", f.runID, i)
			d, err := timed(func() error { _, err := f.c.PullTemplate(ctx, tpl, ref, client.PullOptions{}); return err })
			if err != nil {
				return nil, err
			}
			defer f.c.DeleteTemplate(context.WithoutCancel(ctx), tpl)
			out = append(out, d)
		}
		return out, nil
	}}
	podman := contender{system: SystemPodman, step: func(ctx context.Context) ([]time.Duration, error) {
		cold, cached, err := reg.pushPair(ctx, "podman")
		if err != nil {
			return nil, err
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			_, _ = e.p.podman.run(cctx, "rmi", "--force", "--ignore", cold, cached)
		}()
		var out []time.Duration
		for _, ref := range []string{cold, cached} {
			d, err := e.p.podman.run(ctx, "pull", "--quiet", "--tls-verify=false", ref)
			if err != nil {
				return nil, err
			}
			out = append(out, d)
		}
		return out, nil
	}}
	e.opts.progressf("pull: a small image from a local registry, no layer held and layers held, x %d", e.opts.Warmup+e.opts.N)
	return e.compete(ctx, e.opts.Warmup, e.opts.N, ops, fb, podman)
}
