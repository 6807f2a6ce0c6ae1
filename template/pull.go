package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sync/errgroup"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/image"
	"github.com/forkbox/forkbox/storage/layercache"
)

// maxPullBytes caps the compressed layers of one pulled image, in bytes
// (the extraction's own cap on what they unpack to is the same).
const maxPullBytes = 64 << 30

// pullJobs is how many layers one pull downloads at once.
const pullJobs = 3

// maxLayers bounds the layers of one pulled image (Docker's own limit is
// 127 layers on overlay).
const maxLayers = 256

// maxConfigBytes bounds an image config, which is read into memory.
const maxConfigBytes = 8 << 20

// PullOptions are how Catalog.Pull takes an image from a registry.
type PullOptions struct {
	// Platform picks the image of a multi-platform index: "os/arch" or
	// "os/arch/variant" ("linux/arm64/v8"); "" is the host's
	// (linux/GOARCH). The os must be linux. A single-platform image must
	// be of it too (when its config says).
	Platform string
	// Auth is the credential for the registry (nil: anonymous). It is
	// only ever sent to the registry (and its token service): never
	// stored, logged or put in an error.
	Auth authn.Authenticator
	// InsecureRegistries are registries (host or host:port) the pull may
	// speak plain HTTP to; loopback names (localhost, 127.0.0.1, ::1) may
	// always. Everything else is HTTPS with the host's CAs.
	InsecureRegistries []string
	// AnyAddress lets the pull reach a registry at any address (an
	// admin's pull: the host's owner). Without it only public addresses
	// and the daemon's RegistryPolicy.PrivateRegistries are reached, so
	// that a tenant cannot make the daemon probe its own network.
	AnyAddress bool
	// StartCmd makes the image's ENTRYPOINT and CMD the template's start
	// command (as ImportOptions.StartCmd).
	StartCmd bool
	// MaxBytes caps both the image's compressed layers (checked before
	// anything is downloaded) and the files they unpack to, in bytes (0:
	// the host's cap, 64 GiB); past it the 413 template-too-large naming
	// the limit as MaxBytesName says ("tenant a's max_template_mb").
	MaxBytes     int64
	MaxBytesName string
	// Progress, when not nil, is called as the pull goes on (from the
	// pull's goroutines, one call at a time): once the image is resolved,
	// as each layer downloads (at most every 100 ms, and when it is
	// complete), and when the layers are unpacked.
	Progress func(PullEvent)
}

// PullEvent is one step of a pull (PullOptions.Progress).
type PullEvent struct {
	// Kind is "resolved" (Digest, Platform, Layers set), "layer" (Layer
	// set) or "unpacking".
	Kind string
	// Digest is the manifest digest of the image picked; Platform its
	// platform ("linux/amd64").
	Digest, Platform string
	// Layers are every layer's state, lowest first ("resolved").
	Layers []LayerState
	// Layer is the state of the layer a "layer" event is about.
	Layer LayerState
}

// LayerState is how far one layer of a pull is.
type LayerState struct {
	// Index is the layer's place, 0 for the lowest.
	Index int
	// Digest is the compressed layer's digest; Size its size in bytes.
	Digest string
	Size   int64
	// Done is how many bytes are downloaded (Size when Complete).
	Done int64
	// Cached is true when the layer cache held it: nothing downloaded.
	Cached bool
	// Complete is true when the layer is held (downloaded and verified).
	Complete bool
}

// UsePull lets the catalog pull images from registries (Pull), keeping
// their layers in cache; p says which registries pulls may reach. Call it
// before serving.
func (c *Catalog) UsePull(cache *layercache.Cache, p RegistryPolicy) {
	c.layers, c.registry = cache, p
}

// LayersInUse returns the digests of the compressed layers the recorded
// templates were pulled from (storage.Template.LayerDigests): the layer
// cache never evicts them. It is the inUse of layercache.Open.
func (c *Catalog) LayersInUse(context.Context) (map[string]bool, error) {
	ents, err := os.ReadDir(c.layout.Templates())
	if errors.Is(err, os.ErrNotExist) {
		return map[string]bool{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue // pulls under way pin their layers themselves
		}
		t, err := storage.LoadTemplate(filepath.Join(c.layout.Templates(), e.Name()))
		if errors.Is(err, errdefs.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, d := range t.LayerDigests {
			out[d] = true
		}
	}
	return out, nil
}

// Pull makes template name from the image ref names in its registry
// ("registry.example/library/python:3.12", "alpine" for Docker Hub's,
// "host:5000/app@sha256:..."), owned by tenant ("" shared by every
// tenant). It is the registry counterpart of Import: the image's ENV,
// WORKDIR, USER, ENTRYPOINT and CMD are kept as Import keeps them, and its
// layers are unpacked by storage/image's safe extraction. The builder
// resolves a Dockerfile's `FROM registry/image` with it.
//
// The image's layers are kept in the layer cache once by digest and
// shared between templates: a layer the cache holds from the same
// registry (which a HEAD with o.Auth shows this caller may read) is not
// downloaded again. Every blob is checked against its digest as it
// streams; the manifest against the digest its index or ref names.
//
// Pull does not count the tenant's templates: the caller holds a place
// of its template quota (admission's ReserveQuota), as the import route
// does; o.MaxBytes carries its size limit.
//
// Errors name ref and have the class of what went wrong: ErrInvalidArgument
// (naming the field "ref", "platform" or "insecure_registries") for a
// reference, platform or image that cannot be pulled; ErrConflict for a
// name that exists or is being made; ErrNotFound for an image the
// registry does not have; the 403 registry-denied when it refuses the
// credentials, registry-address-not-allowed for an address the caller may
// not reach, the 502 registry-error for a registry failure or a blob that
// does not match its digest, the 504 registry-unreachable for one that
// does not answer; the 413 template-too-large past o.MaxBytes;
// ErrInsufficientStorage for a full disk. On any error no template is
// recorded, none of its files stay, and the cache keeps only blobs that
// were complete and verified.
func (c *Catalog) Pull(ctx context.Context, tenant, tplName, ref string, o PullOptions) (*storage.Template, error) {
	if c.layers == nil {
		return nil, errdefs.Newf(errdefs.ErrUnavailable, "this daemon has no layer cache: it pulls no images")
	}
	r, want, err := parsePull(ref, o)
	if err != nil {
		return nil, err
	}
	release, err := c.reserve(tplName)
	if err != nil {
		return nil, err
	}
	defer release()
	p := &pull{c: c, ctx: ctx, ref: ref, r: r, o: o}
	tr := pullTransport(c.registry, o)
	defer tr.(*schemeGuard).CloseIdleConnections()
	auth := o.Auth
	if auth == nil {
		auth = authn.Anonymous
	}
	p.puller, err = remote.NewPuller(remote.WithTransport(tr), remote.WithAuth(auth), remote.WithContext(ctx),
		remote.WithUserAgent("forkbox"), remote.WithRetryBackoff(remote.Backoff{Duration: 250 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 3}))
	if err != nil {
		return nil, fmt.Errorf("pull %s: %w", ref, err)
	}
	img, digest, plat, err := p.resolve(want)
	if err != nil {
		return nil, registryError(ref, err)
	}
	layers, err := p.layers(img)
	if err != nil {
		return nil, registryError(ref, err)
	}
	// Deferred first, so run last (once the pins below are released), on
	// success and failure alike: a pull that fails after its layers are
	// downloaded must not leave the cache over its bound.
	defer func() { _, _ = c.layers.Evict(context.WithoutCancel(ctx)) }()
	for _, l := range layers {
		defer c.layers.Pin(l.digest)()
	}
	p.event(PullEvent{Kind: "resolved", Digest: digest.String(), Platform: plat, Layers: p.states(layers)})
	if err := p.fetch(layers); err != nil {
		return nil, registryError(ref, err)
	}
	p.event(PullEvent{Kind: "unpacking", Digest: digest.String(), Platform: plat})
	cached := &cachedImage{Image: img}
	digests := make([]string, len(layers))
	for i, l := range layers {
		// (Uncompressed: gzip, zstd or none, as the blob's bytes say.)
		ul, err := partial.CompressedToLayer(&cachedLayer{cache: c.layers, l: l})
		if err != nil {
			return nil, err
		}
		cached.layers = append(cached.layers, ul)
		digests[i] = l.digest.String()
	}
	iopts := ImportOptions{Source: ref, StartCmd: o.StartCmd}
	t, err := c.install(ctx, tplName, tenant, iopts, func(rootfs string, shift image.IDShift) (*image.Image, error) {
		out, err := image.Apply(ctx, cached, digest, rootfs, shift, image.Limits{MaxBytes: o.MaxBytes})
		return out, tooLarge(err, o.MaxBytes, o.MaxBytesName)
	}, func(t *storage.Template) { t.LayerDigests = digests })
	if err != nil {
		return nil, err
	}
	return t, nil
}

// parsePull checks a pull's reference and platform: the reference parsed
// (plain HTTP allowed to the registry when o names it insecure) and the
// platform wanted.
func parsePull(ref string, o PullOptions) (name.Reference, v1.Platform, error) {
	if ref == "" {
		return nil, v1.Platform{}, errdefs.InvalidField("ref", "is empty: name an image (registry.example/library/python:3.12)")
	}
	if err := CheckSource(ref); err != nil {
		return nil, v1.Platform{}, errdefs.InvalidField("ref", "must be at most %d bytes of printable text", maxSourceLen)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, v1.Platform{}, errdefs.InvalidField("ref", "%q is not an image reference: %v", ref, err)
	}
	if registryListed(r.Context().RegistryStr(), o.InsecureRegistries) {
		if r, err = name.ParseReference(ref, name.Insecure); err != nil {
			return nil, v1.Platform{}, errdefs.InvalidField("ref", "%q is not an image reference: %v", ref, err)
		}
	}
	want := v1.Platform{OS: "linux", Architecture: runtime.GOARCH}
	if o.Platform != "" {
		pp, err := v1.ParsePlatform(o.Platform)
		if err != nil || pp.OS == "" || pp.Architecture == "" || strings.Count(o.Platform, "/") > 2 {
			return nil, v1.Platform{}, errdefs.InvalidField("platform", "%q is not os/arch[/variant] (linux/amd64)", o.Platform)
		}
		if pp.OS != "linux" {
			return nil, v1.Platform{}, errdefs.InvalidField("platform", "%q: sandboxes run linux images only", o.Platform)
		}
		want = v1.Platform{OS: pp.OS, Architecture: pp.Architecture, Variant: pp.Variant}
	}
	return r, want, nil
}

// pull is one Catalog.Pull under way.
type pull struct {
	c      *Catalog
	ctx    context.Context
	ref    string
	r      name.Reference
	o      PullOptions
	puller *remote.Puller

	mu   sync.Mutex // one Progress call at a time
	last time.Time  // of the last "layer" event sent
}

// event sends e to o.Progress, one call at a time.
func (p *pull) event(e PullEvent) {
	if p.o.Progress == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.o.Progress(e)
}

// layerProgress sends a "layer" event for s, at most every 100 ms unless
// s is complete.
func (p *pull) layerProgress(s LayerState) {
	if p.o.Progress == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !s.Complete && time.Since(p.last) < 100*time.Millisecond {
		return
	}
	p.last = time.Now()
	p.o.Progress(PullEvent{Kind: "layer", Layer: s})
}

// resolve fetches ref's manifest and, for an index, picks the image of
// platform want; it returns the image, its manifest digest and its
// platform.
func (p *pull) resolve(want v1.Platform) (v1.Image, v1.Hash, string, error) {
	desc, err := p.puller.Get(p.ctx, p.r)
	if err != nil {
		return nil, v1.Hash{}, "", err
	}
	switch {
	case desc.MediaType.IsIndex():
		idx, err := desc.ImageIndex()
		if err != nil {
			return nil, v1.Hash{}, "", err
		}
		return pickPlatform(p.ref, idx, desc.Digest, want, 0)
	case desc.MediaType.IsImage():
		img, err := desc.Image()
		if err != nil {
			return nil, v1.Hash{}, "", err
		}
		if m, err := img.Manifest(); err != nil {
			return nil, v1.Hash{}, "", err
		} else if m.Config.Size > maxConfigBytes || m.Config.Size < 0 {
			return nil, v1.Hash{}, "", errdefs.InvalidField("ref", "image %s: its config is %d bytes (at most %d)", p.ref, m.Config.Size, maxConfigBytes)
		}
		cfg, err := img.ConfigFile()
		if err != nil {
			return nil, v1.Hash{}, "", err
		}
		got := v1.Platform{OS: cfg.OS, Architecture: cfg.Architecture, Variant: cfg.Variant}
		if (got.OS != "" || got.Architecture != "") && !got.Satisfies(want) {
			return nil, v1.Hash{}, "", errdefs.InvalidField("platform", "image %s is for %s, not %s (pass --platform to pull another)",
				p.ref, got.String(), want.String())
		}
		plat := got.String()
		if plat == "" {
			plat = want.String()
		}
		return img, desc.Digest, plat, nil
	}
	return nil, v1.Hash{}, "", errdefs.InvalidField("ref", "%s is a %q, not an image or an image index", p.ref, desc.MediaType)
}

// pickPlatform returns the image of platform want in index idx (ref's,
// whose digest is d; nested indexes are followed, depth bounds them).
func pickPlatform(ref string, idx v1.ImageIndex, d v1.Hash, want v1.Platform, depth int) (v1.Image, v1.Hash, string, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, v1.Hash{}, "", err
	}
	var have []string
	for _, m := range im.Manifests {
		if m.Platform == nil || m.Platform.OS == "unknown" { // attestations
			continue
		}
		have = append(have, m.Platform.String())
		if !m.Platform.Satisfies(want) {
			continue
		}
		switch {
		case m.MediaType.IsImage():
			img, err := idx.Image(m.Digest)
			if err != nil {
				return nil, v1.Hash{}, "", err
			}
			return img, m.Digest, m.Platform.String(), nil
		case m.MediaType.IsIndex() && depth < 2:
			child, err := idx.ImageIndex(m.Digest)
			if err != nil {
				return nil, v1.Hash{}, "", err
			}
			return pickPlatform(ref, child, m.Digest, want, depth+1)
		}
	}
	if len(have) == 0 {
		have = []string{"none"}
	}
	return nil, v1.Hash{}, "", errdefs.InvalidField("platform", "image %s (index %s) has no image for %s; it has %s",
		ref, d, want.String(), strings.Join(have, ", "))
}

// layer is one compressed layer of the image being pulled.
type layer struct {
	index  int
	digest v1.Hash
	size   int64
	media  types.MediaType
	remote v1.Layer
}

// layers lists img's layers from its manifest and fetches its config,
// refusing what cannot be pulled (a non-distributable layer, one that is
// no layer, too many layers, a config too large) and an image past the
// size limits before any layer is downloaded.
func (p *pull) layers(img v1.Image) ([]layer, error) {
	m, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	if len(m.Layers) > maxLayers {
		return nil, errdefs.InvalidField("ref", "image %s has %d layers, more than %d", p.ref, len(m.Layers), maxLayers)
	}
	if m.Config.Size > maxConfigBytes || m.Config.Size < 0 {
		return nil, errdefs.InvalidField("ref", "image %s: its config is %d bytes (at most %d)", p.ref, m.Config.Size, maxConfigBytes)
	}
	// The config now, so that a registry's failure to serve it is told
	// as one (Apply checks it against its digest).
	if _, err := img.RawConfigFile(); err != nil {
		return nil, err
	}
	limit, limitName := int64(maxPullBytes), "the host's limit"
	if p.o.MaxBytes > 0 && p.o.MaxBytes < limit {
		limit, limitName = p.o.MaxBytes, p.o.MaxBytesName
	}
	var out []layer
	var total int64
	for i, d := range m.Layers {
		if !d.MediaType.IsLayer() {
			return nil, errdefs.InvalidField("ref", "image %s: layer %d has media type %q, which is no layer", p.ref, i+1, d.MediaType)
		}
		if !d.MediaType.IsDistributable() {
			return nil, errdefs.InvalidField("ref", "image %s: layer %d is non-distributable (%q): forkbox pulls only layers the registry serves",
				p.ref, i+1, d.MediaType)
		}
		if err := checkLayerDigest(d.Digest); err != nil {
			return nil, errdefs.InvalidField("ref", "image %s: layer %d: %v", p.ref, i+1, err)
		}
		if d.Size < 0 {
			return nil, errdefs.InvalidField("ref", "image %s: layer %d has a negative size", p.ref, i+1)
		}
		// Compared before adding: a hostile manifest's sizes could sum
		// past int64 and wrap below the limit.
		if d.Size > limit-total {
			return nil, tooLargeError(p.ref, total+min(d.Size, math.MaxInt64-total), limit, limitName)
		}
		rl, err := img.LayerByDigest(d.Digest)
		if err != nil {
			return nil, err
		}
		total += d.Size
		out = append(out, layer{index: i, digest: d.Digest, size: d.Size, media: d.MediaType, remote: rl})
	}
	return out, nil
}

// checkLayerDigest refuses a digest the layer cache cannot keep.
func checkLayerDigest(d v1.Hash) error {
	n := map[string]int{"sha256": 64, "sha512": 128}[d.Algorithm]
	if n == 0 || len(d.Hex) != n || strings.Trim(d.Hex, "0123456789abcdef") != "" {
		return fmt.Errorf("digest %q is not a sha256 or sha512 digest", d.String())
	}
	return nil
}

// states are the layers' states before anything is fetched.
func (p *pull) states(ls []layer) []LayerState {
	out := make([]LayerState, len(ls))
	for i, l := range ls {
		size, _, held := p.c.layers.Stat(l.digest)
		out[i] = LayerState{Index: i, Digest: l.digest.String(), Size: l.size}
		if held && size == l.size {
			out[i].Cached = true // (if the registry grants it: fetch says)
		}
	}
	return out
}

// fetch makes every layer held by the cache, pullJobs at a time.
func (p *pull) fetch(ls []layer) error {
	g, ctx := errgroup.WithContext(p.ctx)
	g.SetLimit(pullJobs)
	registry := p.r.Context().RegistryStr()
	for _, l := range ls {
		g.Go(func() error {
			src := layercache.Source{
				Registry: registry,
				Open:     l.remote.Compressed,
				Granted: func() (bool, error) {
					rl, err := p.puller.Layer(ctx, p.r.Context().Digest(l.digest.String()))
					if err != nil {
						return false, nil
					}
					ok, err := partial.Exists(rl)
					return ok && err == nil, nil // a refused HEAD: the GET says why
				},
			}
			state := LayerState{Index: l.index, Digest: l.digest.String(), Size: l.size}
			held, err := p.c.layers.Ensure(ctx, l.digest, l.size, src, func(n int64) {
				s := state
				s.Done = n
				p.layerProgress(s)
			})
			if err != nil {
				return err
			}
			state.Done, state.Cached, state.Complete = l.size, held, true
			p.layerProgress(state)
			return nil
		})
	}
	return g.Wait()
}

// cachedImage is a pulled image whose layers are read from the layer
// cache (the manifest and config are the registry's, already fetched).
type cachedImage struct {
	v1.Image
	layers []v1.Layer
}

// Layers returns the cached layers, lowest first.
func (i *cachedImage) Layers() ([]v1.Layer, error) { return i.layers, nil }

// cachedLayer is one layer as the layer cache holds it (a
// partial.CompressedLayer).
type cachedLayer struct {
	cache *layercache.Cache
	l     layer
}

// Digest is the compressed layer's digest.
func (l *cachedLayer) Digest() (v1.Hash, error) { return l.l.digest, nil }

// Size is the compressed layer's size in bytes.
func (l *cachedLayer) Size() (int64, error) { return l.l.size, nil }

// MediaType is the layer's media type as the manifest gives it.
func (l *cachedLayer) MediaType() (types.MediaType, error) { return l.l.media, nil }

// Compressed opens the cached blob.
func (l *cachedLayer) Compressed() (io.ReadCloser, error) { return l.cache.Open(l.l.digest) }

// tooLargeError is the 413 template-too-large of an image of at least
// size bytes, over limit (named limitName).
func tooLargeError(ref string, size, limit int64, limitName string) error {
	if limitName == "" {
		limitName = "the limit"
	}
	return errdefs.Typed(errdefs.ErrResourceExhausted, ProblemTemplateTooLarge,
		"image %s: its layers are at least %d bytes, more than %s of %d bytes", ref, size, limitName, limit)
}

// tooLarge turns an extraction's image.ErrTooLarge into the 413
// template-too-large naming the limit; other errors are returned as they
// are.
func tooLarge(err error, limit int64, limitName string) error {
	if err == nil || !errors.Is(err, image.ErrTooLarge) {
		return err
	}
	if limitName == "" || limit <= 0 {
		limitName = "the host's limit"
	}
	return errdefs.Typed(errdefs.ErrResourceExhausted, ProblemTemplateTooLarge, "%s (%s)", err.Error(), limitName)
}
