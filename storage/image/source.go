package image

import (
	"archive/tar"
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/forkbox/forkbox/errdefs"
)

// Annotations on OCI index descriptors that name an image.
const (
	annotationRefName        = "org.opencontainers.image.ref.name"
	annotationContainerdName = "io.containerd.image.name"
)

// source is one selected, verified image ready to be applied.
type source struct {
	// digest is the sha256 (or other algorithm) digest of the raw manifest.
	digest v1.Hash
	// cfg is the parsed image config; its bytes matched the manifest digest.
	cfg *v1.ConfigFile
	// layers are the image layers, lowest first; len(layers) == len(cfg.RootFS.DiffIDs).
	layers []v1.Layer
}

// invalidf returns an errdefs.ErrInvalidArgument error with a formatted message.
func invalidf(format string, args ...any) error {
	return errdefs.Newf(errdefs.ErrInvalidArgument, format, args...)
}

// openSource opens the image at src (a layout directory or a tar file, see
// Import), selects the image named by ref and verifies the manifest and
// config digests. tmpParent is a directory where an OCI layout packed as a tar
// is unpacked (into a fresh temporary directory). The returned func releases
// temporary files and must be called once the layers have been read; it is
// non-nil even on error. Malformed sources and unknown refs are
// errdefs.ErrInvalidArgument errors.
func openSource(src, ref, tmpParent string) (*source, func(), error) {
	noop := func() {}
	fi, err := os.Stat(src)
	if err != nil {
		return nil, noop, err
	}
	switch {
	case fi.IsDir():
		s, err := openLayoutDir(src, ref)
		return s, noop, err
	case !fi.Mode().IsRegular():
		return nil, noop, invalidf("source is neither a directory nor a regular file")
	}
	kind, err := sniffTar(src)
	if err != nil {
		return nil, noop, err
	}
	if kind == "docker" {
		s, err := openDockerTar(src, ref)
		return s, noop, err
	}
	tmp, err := os.MkdirTemp(tmpParent, ".image-oci-*")
	if err != nil {
		return nil, noop, err
	}
	cleanup := func() { os.RemoveAll(tmp) }
	if err := unpackLayoutTar(src, tmp); err != nil {
		return nil, cleanup, err
	}
	s, err := openLayoutDir(tmp, ref)
	return s, cleanup, err
}

// tarName normalizes a member name of a source tar ("./index.json",
// "/index.json" -> "index.json"); "" for the root.
func tarName(n string) string {
	return strings.TrimPrefix(path.Clean("/"+n), "/")
}

// sniffTar scans the member names of the tar file at src and returns "docker"
// when it holds manifest.json (docker save format) or "oci" when it holds
// oci-layout and index.json. Anything else, or an unreadable tar, is an
// errdefs.ErrInvalidArgument error.
func sniffTar(src string) (string, error) {
	f, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	seen := map[string]bool{}
	for n := 0; ; n++ {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", invalidf("read source tar: %v", err)
		}
		if n >= maxEntries {
			return "", errdefs.Newf(errdefs.ErrResourceExhausted, "source tar has more than %d entries", maxEntries)
		}
		switch nm := tarName(hdr.Name); nm {
		case "manifest.json", "oci-layout", "index.json":
			seen[nm] = true
		}
	}
	switch {
	case seen["manifest.json"]:
		return "docker", nil
	case seen["oci-layout"] && seen["index.json"]:
		return "oci", nil
	}
	return "", invalidf("tar is neither a docker save archive (manifest.json) nor an OCI layout (oci-layout, index.json)")
}

// unpackLayoutTar copies the OCI layout members of the tar file src
// (oci-layout, index.json and blobs/<algorithm>/<hex>, regular files only)
// into the empty directory dir; other members are ignored. Member names are
// validated as digests, so nothing is written outside dir. Blob bytes count
// against maxImageBytes.
func unpackLayoutTar(src, dir string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	var total int64
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return invalidf("read OCI layout tar: %v", err)
		}
		nm := tarName(hdr.Name)
		var dst string
		switch parts := strings.Split(nm, "/"); {
		case nm == "oci-layout" || nm == "index.json":
			dst = filepath.Join(dir, nm)
		case len(parts) == 3 && parts[0] == "blobs":
			if _, err := v1.NewHash(parts[1] + ":" + parts[2]); err != nil {
				return invalidf("OCI layout tar member %q: %v", hdr.Name, err)
			}
			if err := os.MkdirAll(filepath.Join(dir, "blobs", parts[1]), 0o700); err != nil {
				return err
			}
			dst = filepath.Join(dir, "blobs", parts[1], parts[2])
		default:
			continue
		}
		if hdr.Typeflag != tar.TypeReg {
			return invalidf("OCI layout tar member %q is not a regular file", hdr.Name)
		}
		if total += hdr.Size; total > maxImageBytes {
			return errdefs.Newf(errdefs.ErrResourceExhausted, "OCI layout tar larger than %d bytes", maxImageBytes)
		}
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			if errors.Is(err, os.ErrExist) {
				return invalidf("OCI layout tar member %q appears twice", hdr.Name)
			}
			return err
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return classify(err)
		}
	}
}

// openLayoutDir selects the image named by ref in the OCI layout directory
// dir (see Import for matching) and verifies it. The layout's blobs directory
// and its per-algorithm subdirectories must be real directories, not
// symlinks, so blobs cannot be read from elsewhere on the host.
func openLayoutDir(dir, ref string) (*source, error) {
	for _, f := range []string{"oci-layout", "index.json"} {
		fi, err := os.Lstat(filepath.Join(dir, f))
		if err != nil || !fi.Mode().IsRegular() {
			return nil, invalidf("OCI layout %q: %s missing or not a regular file", dir, f)
		}
	}
	blobs := filepath.Join(dir, "blobs")
	if fi, err := os.Lstat(blobs); err == nil {
		if !fi.IsDir() {
			return nil, invalidf("OCI layout %q: blobs is not a directory", dir)
		}
		ents, err := os.ReadDir(blobs)
		if err != nil {
			return nil, err
		}
		for _, e := range ents {
			if !e.IsDir() {
				return nil, invalidf("OCI layout %q: blobs/%s is not a directory", dir, e.Name())
			}
		}
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, invalidf("OCI layout %q: %v", dir, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, invalidf("OCI layout %q: %v", dir, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, invalidf("OCI layout %q: index.json: %v", dir, err)
	}
	var picked []v1.Descriptor
	for _, d := range im.Manifests {
		if ref == "" || matchesAny(ref, d.Annotations[annotationRefName], d.Annotations[annotationContainerdName]) {
			picked = append(picked, d)
		}
	}
	desc, err := pickOne(picked, ref, func(d v1.Descriptor) string { return d.Digest.String() })
	if err != nil {
		return nil, err
	}
	img, digest, err := resolveDescriptor(idx, desc, 0)
	if err != nil {
		return nil, err
	}
	return verify(img, digest)
}

// resolveDescriptor returns the image for desc, an entry of idx, and the
// manifest digest its descriptor declares: the image itself for a manifest,
// or for a nested index the linux/GOARCH image in it (an index holding
// exactly one image manifest is accepted whatever its platform). depth
// bounds the nesting of indexes.
func resolveDescriptor(idx v1.ImageIndex, desc v1.Descriptor, depth int) (v1.Image, v1.Hash, error) {
	switch {
	case desc.MediaType.IsImage():
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return nil, v1.Hash{}, invalidf("image %s: %v", desc.Digest, err)
		}
		return img, desc.Digest, nil
	case desc.MediaType.IsIndex() && depth < 4:
		child, err := idx.ImageIndex(desc.Digest)
		if err != nil {
			return nil, v1.Hash{}, invalidf("index %s: %v", desc.Digest, err)
		}
		im, err := child.IndexManifest()
		if err != nil {
			return nil, v1.Hash{}, invalidf("index %s: %v", desc.Digest, err)
		}
		var images, native []v1.Descriptor
		for _, d := range im.Manifests {
			if !d.MediaType.IsImage() && !d.MediaType.IsIndex() {
				continue
			}
			images = append(images, d)
			if d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH {
				native = append(native, d)
			}
		}
		switch {
		case len(native) > 0:
			return resolveDescriptor(child, native[0], depth+1)
		case len(images) == 1:
			return resolveDescriptor(child, images[0], depth+1)
		}
		return nil, v1.Hash{}, invalidf("index %s has no linux/%s image", desc.Digest, runtime.GOARCH)
	}
	return nil, v1.Hash{}, invalidf("descriptor %s has unsupported media type %q", desc.Digest, desc.MediaType)
}

// openDockerTar selects the image named by ref among the RepoTags of the
// `docker save` tarball at src and verifies it.
func openDockerTar(src, ref string) (*source, error) {
	opener := func() (io.ReadCloser, error) { return os.Open(src) }
	m, err := tarball.LoadManifest(opener)
	if err != nil {
		return nil, invalidf("docker archive manifest.json: %v", err)
	}
	type hit struct {
		config string
		tag    string
	}
	var picked []hit
	for _, d := range m {
		for _, t := range d.RepoTags {
			if ref == "" || matchesAny(ref, t) {
				picked = append(picked, hit{d.Config, t})
				break
			}
		}
		if ref == "" && len(d.RepoTags) == 0 {
			picked = append(picked, hit{d.Config, ""})
		}
	}
	h, err := pickOne(picked, ref, func(h hit) string { return h.config })
	if err != nil {
		return nil, err
	}
	var tag *name.Tag
	if ref != "" || len(m) > 1 {
		t, err := name.NewTag(h.tag)
		if err != nil {
			return nil, invalidf("docker archive tag %q: %v", h.tag, err)
		}
		tag = &t
	}
	img, err := tarball.Image(opener, tag)
	if err != nil {
		return nil, invalidf("docker archive: %v", err)
	}
	return verify(img, v1.Hash{})
}

// verify checks that img's raw manifest hashes to want (when want is not
// zero), that its config hashes to the manifest's config digest, that the
// config is for linux and lists one diff id per layer, and returns the
// source. Mismatches are errdefs.ErrInvalidArgument errors.
func verify(img v1.Image, want v1.Hash) (*source, error) {
	rawM, err := img.RawManifest()
	if err != nil {
		return nil, invalidf("read manifest: %v", err)
	}
	alg := want.Algorithm
	if alg == "" {
		alg = "sha256"
	}
	got, err := hashOf(alg, rawM)
	if err != nil {
		return nil, err
	}
	if want != (v1.Hash{}) && got != want {
		return nil, invalidf("manifest digest %s does not match descriptor %s", got, want)
	}
	m, err := v1.ParseManifest(bytes.NewReader(rawM))
	if err != nil {
		return nil, invalidf("parse manifest: %v", err)
	}
	if m.Config.MediaType != "" && m.Config.MediaType != types.OCIConfigJSON && m.Config.MediaType != types.DockerConfigJSON {
		return nil, invalidf("manifest config has unsupported media type %q", m.Config.MediaType)
	}
	rawC, err := img.RawConfigFile()
	if err != nil {
		return nil, invalidf("read config: %v", err)
	}
	if c, err := hashOf(m.Config.Digest.Algorithm, rawC); err != nil || c != m.Config.Digest {
		return nil, invalidf("config does not match its digest %s", m.Config.Digest)
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(rawC))
	if err != nil {
		return nil, invalidf("parse config: %v", err)
	}
	if cfg.OS != "" && cfg.OS != "linux" {
		return nil, invalidf("image is for %q, not linux", cfg.OS)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, invalidf("layers: %v", err)
	}
	if len(layers) != len(cfg.RootFS.DiffIDs) || len(layers) != len(m.Layers) {
		return nil, invalidf("manifest has %d layers but config lists %d diff ids", len(m.Layers), len(cfg.RootFS.DiffIDs))
	}
	return &source{digest: got, cfg: cfg, layers: layers}, nil
}

// hashOf returns the digest of data with the named algorithm ("sha256" or
// "sha512"); an unknown algorithm is an errdefs.ErrInvalidArgument error.
func hashOf(alg string, data []byte) (v1.Hash, error) {
	h, err := v1.Hasher(alg)
	if err != nil {
		return v1.Hash{}, invalidf("%v", err)
	}
	h.Write(data)
	return v1.Hash{Algorithm: alg, Hex: hex.EncodeToString(h.Sum(nil))}, nil
}
