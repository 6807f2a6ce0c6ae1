package build

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/template"
)

// defaultMaxAddBytes bounds what one ADD downloads or extracts when the
// build has no size limit of its own (Spec.MaxBytes, Spec.DiskMB), in
// bytes: the REST API's bound on a build context.
const defaultMaxAddBytes = 4 << 30

// maxAddSpools bounds the archives and downloads of one build, each a
// spool file the daemon keeps open until the build ends.
const maxAddSpools = 1000

// isURL reports whether an ADD source is a URL (Docker's rule: http://
// or https://); other schemes and git sources are refused by Parse.
func isURL(s string) bool {
	return strings.HasPrefix(s, "http://") || strings.HasPrefix(s, "https://")
}

// addLimit is how many bytes a build's ADDs may download or extract
// together (all are spooled on the host until the build ends) and how
// errors name that bound: the build's template size limit, else its
// step sandbox's disk, else defaultMaxAddBytes.
func (r *run) addLimit() (int64, string) {
	limit, name := int64(defaultMaxAddBytes), fmt.Sprintf("the %d bytes one ADD may bring", int64(defaultMaxAddBytes))
	if r.spec.DiskMB > 0 && r.spec.DiskMB<<20 < limit {
		limit, name = r.spec.DiskMB<<20, fmt.Sprintf("the build's disk_mb (%d MiB)", r.spec.DiskMB)
	}
	if r.spec.MaxBytes > 0 && r.spec.MaxBytes < limit {
		limit, name = r.spec.MaxBytes, r.spec.MaxName
		if name == "" {
			name = fmt.Sprintf("the template size limit (%d bytes)", r.spec.MaxBytes)
		}
	}
	return limit, name
}

// tooLarge is the 413 template-too-large of an ADD past addLimit.
func (r *run) tooLarge(what string) error {
	_, name := r.addLimit()
	return errdefs.Typed(errdefs.ErrResourceExhausted, template.ProblemTemplateTooLarge, "ADD %s: larger than %s (with what the build's other ADDs brought)", what, name)
}

// planAdd plans an ADD as Docker does it: a URL source is downloaded
// (by the daemon, through the build's egress allow-list: Fetcher) into
// one file of mode 0600, named by the URL's last path element when the
// destination is a directory; a local source that is a tar (plain,
// gzip, bzip2 or zstd) is extracted into the destination directory
// (openTar's archive rules; its entries keep their owners); every other
// source is copied as COPY does. --chown and --chmod apply to all of it.
// The step's key holds the digest of every byte it writes (the
// downloaded bytes included: a changed download is a new step).
func (r *run) planAdd(ctx context.Context, c *instructions.AddCommand) (*action, error) {
	mode, err := parseChmod(c.Chmod)
	if err != nil {
		return nil, err
	}
	abs := r.abs(c.DestPath)
	toDir := strings.HasSuffix(c.DestPath, "/") || len(c.SourcePaths) > 1
	owner, _, _ := strings.Cut(c.Chown, ":")
	a := &action{kind: "copy", owner: owner, chmod: mode, instr: fmt.Sprintf("add %q -> %q", c.SourcePaths, abs)}
	h := sha256.New()
	fmt.Fprintf(h, "owner %q chmod %o\n", c.Chown, mode)
	var locals []string
	for _, s := range c.SourcePaths {
		if !isURL(s) {
			locals = append(locals, s)
			continue
		}
		t, err := r.download(ctx, s, abs, toDir)
		if err != nil {
			return nil, err
		}
		a.picks = append(a.picks, t)
		fmt.Fprintf(h, "url %q -> %q %s\n", s, t.to, t.e.Digest)
	}
	if len(locals) == 0 {
		a.inputs = hex.EncodeToString(h.Sum(nil))
		return a, nil
	}
	if r.spec.Context == nil {
		return nil, fmt.Errorf("ADD needs a build context (--context)")
	}
	var plain []string
	for _, s := range locals {
		picks, dir, err := r.spec.Context.Select(s)
		if err != nil {
			return nil, err
		}
		named := !dir
		for _, p := range picks {
			named = named && rootFile(s, p)
		}
		if !named {
			plain = append(plain, s) // a directory (or a glob reaching into one): copied as COPY does
			continue
		}
		// Each file the source names itself: an archive is extracted,
		// another file copied.
		var files []Pick
		for _, p := range picks {
			ar, err := r.openArchive(p.E)
			if err != nil {
				return nil, fmt.Errorf("ADD %s: %w", p.E.Path, err)
			}
			if ar == nil {
				files = append(files, p)
				continue
			}
			xp, _, err := ar.Select(".")
			if err != nil {
				return nil, err
			}
			for _, x := range xp {
				if x.Rel == "." {
					continue // the destination itself
				}
				a.picks = append(a.picks, copyTarget{e: x.E, to: path.Join(abs, x.Rel), src: ar, archive: true})
				fmt.Fprintf(h, "archive %q -> %q %c %o %d:%d %q %s\n", p.E.Path, x.Rel, x.E.Type, x.E.Mode, x.E.UID, x.E.GID, x.E.Link, x.E.Digest)
			}
		}
		if len(files) > 0 {
			multi := toDir || len(files) > 1 || strings.ContainsAny(s, "*?[")
			for _, p := range files {
				to := abs
				if multi {
					to = path.Join(abs, p.Rel)
				}
				a.picks = append(a.picks, copyTarget{e: p.E, to: to})
			}
			fmt.Fprintf(h, "files %q multi %t %s\n", s, multi, Digest(files))
		}
	}
	if len(plain) > 0 {
		cp, err := r.planCopy("copy", plain, c.DestPath, c.Chown)
		if err != nil {
			return nil, err
		}
		a.picks = append(a.picks, cp.picks...)
		fmt.Fprintf(h, "copy %s\n", cp.inputs)
	}
	a.inputs = hex.EncodeToString(h.Sum(nil))
	return a, nil
}

// rootFile reports whether pick p of source src is a file src names
// itself (its path or a glob match), not an entry of a directory it
// names.
func rootFile(src string, p Pick) bool {
	if p.E.Type != tar.TypeReg {
		return false
	}
	clean := strings.TrimPrefix(path.Clean("/"+src), "/")
	if clean == p.E.Path {
		return true
	}
	ok, _ := path.Match(clean, p.E.Path)
	return ok
}

// parseChmod parses ADD --chmod (octal, at most 07777); "" is 0 (keep
// the source's modes).
func parseChmod(s string) (int64, error) {
	if s == "" {
		return 0, nil
	}
	m, err := strconv.ParseUint(s, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, fmt.Errorf("--chmod=%s: want an octal mode such as 0755", s)
	}
	return int64(m), nil
}

// download fetches URL u through the builder's Fetcher into a spool file
// and returns its target: abs, or abs/NAME (the URL path's last element)
// when toDir. The build's allow-list decides (none: no network, refused
// before any connection).
func (r *run) download(ctx context.Context, u, abs string, toDir bool) (copyTarget, error) {
	pu, err := url.Parse(u)
	if err != nil || pu.Host == "" {
		return copyTarget{}, fmt.Errorf("ADD %s: not a URL", u)
	}
	if len(r.spec.Allow) == 0 {
		return copyTarget{}, fmt.Errorf("ADD %s: %s is not allowed: the build has no egress allow-list (no network; give one with --allow)", u, pu.Host)
	}
	name := path.Base(pu.Path)
	if name == "/" || name == "." || name == "" {
		name = "index.html"
	}
	if name == ".." {
		return copyTarget{}, errdefs.InvalidField("dockerfile", "ADD %s: the URL's last path element is \"..\", no file name", u)
	}
	if r.b.fetcher == nil {
		return copyTarget{}, errdefs.Newf(errdefs.ErrUnavailable, "ADD %s: this daemon has no egress service, so it downloads nothing", u)
	}
	f, err := r.spool()
	if err != nil {
		return copyTarget{}, err
	}
	limit, _ := r.addLimit()
	limit -= r.spooled
	if limit <= 0 {
		return copyTarget{}, r.tooLarge(u)
	}
	sum := sha256.New()
	n, err := r.b.fetcher.Fetch(ctx, u, r.spec.Allow, limit, io.MultiWriter(f, sum))
	r.spooled += n
	if errors.Is(err, errdefs.ErrResourceExhausted) {
		return copyTarget{}, r.tooLarge(u)
	}
	if err != nil {
		return copyTarget{}, fmt.Errorf("ADD %s: %w", u, err)
	}
	e := &Entry{Path: name, Type: tar.TypeReg, Mode: 0o600, Size: n, Digest: hex.EncodeToString(sum.Sum(nil))}
	to := abs
	if toDir {
		to = path.Join(abs, name)
	}
	return copyTarget{e: e, to: to, src: &Context{f: f, entries: map[string]*Entry{name: e}}}, nil
}

// spool makes a temporary file in the spec's spool directory, removed
// when the build ends.
func (r *run) spool() (*os.File, error) {
	if len(r.spools) >= maxAddSpools {
		return nil, errdefs.InvalidField("dockerfile", "ADD: more than %d archives and downloads in one build", maxAddSpools)
	}
	f, err := os.CreateTemp(r.spec.SpoolDir, template.UploadPattern)
	if err != nil {
		return nil, fmt.Errorf("spool an ADD: %w", err)
	}
	r.spools = append(r.spools, f)
	return f, nil
}

// removeSpools closes and removes the build's spool files.
func (r *run) removeSpools() {
	for _, f := range r.spools {
		f.Close()
		os.Remove(f.Name())
	}
	r.spools = nil
}

// maxZstdWindow bounds the window a zstd archive's frames may ask for
// (the decoder's buffer, allocated as the frame says), in bytes: 128
// MiB, the zstd tool's default decompression limit (windowLog 27).
const maxZstdWindow = 1 << 27

// Compression magics (the first bytes of a stream), as Docker detects
// an ADD's archive.
var (
	magicGzip  = []byte{0x1f, 0x8b}
	magicBzip2 = []byte("BZh")
	magicXz    = []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}
	magicZstd  = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// openArchive returns context file e as an archive ADD extracts, or nil
// when it is not one (then it is copied as a file): a tar, plain or
// compressed with gzip, bzip2 or zstd, is decompressed into a spool file
// (at most addLimit bytes) and indexed by openTar's archive rules. An xz
// archive is refused (no xz reader here: unpack it in a RUN).
func (r *run) openArchive(e *Entry) (*Context, error) {
	br := bufio.NewReaderSize(r.spec.Context.Open(e), 64<<10)
	head, _ := br.Peek(512)
	var rd io.Reader = br
	switch {
	case bytes.HasPrefix(head, magicGzip):
		z, err := gzip.NewReader(br)
		if err != nil {
			return nil, nil // not gzip after all: a file
		}
		defer z.Close()
		rd = z
	case bytes.HasPrefix(head, magicBzip2):
		rd = bzip2.NewReader(br)
	case bytes.HasPrefix(head, magicZstd):
		z, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(maxZstdWindow))
		if err != nil {
			return nil, nil
		}
		defer z.Close()
		rd = z
	case bytes.HasPrefix(head, magicXz):
		return nil, errdefs.InvalidField("dockerfile", "xz-compressed archives are not extracted here: COPY it and unpack it in a RUN, or use gzip, bzip2 or zstd")
	default:
		if !isTarHeader(head) {
			return nil, nil
		}
	}
	limit, _ := r.addLimit()
	limit -= r.spooled
	f, err := r.spool()
	if err != nil {
		return nil, err
	}
	n, err := io.Copy(f, io.LimitReader(rd, max(limit, 0)+1))
	r.spooled += n
	if errors.Is(err, zstd.ErrWindowSizeExceeded) {
		return nil, errdefs.InvalidField("dockerfile", "ADD %s: its zstd frames need a window larger than the %d MiB this daemon decodes with (the zstd tool's default limit); recompress it without --long", e.Path, maxZstdWindow>>20)
	}
	if err != nil && rd == io.Reader(br) {
		return nil, err
	}
	if err != nil {
		return nil, nil // a corrupt stream is no archive: Docker copies such a file as it is
	}
	if n > limit {
		return nil, r.tooLarge(e.Path + " (extracted)")
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	tr := tar.NewReader(f)
	if _, err := tr.Next(); err != nil {
		return nil, nil // decompressed, but not a tar: a file
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, err
	}
	ar, err := openTar(f, "dockerfile", true)
	if err != nil {
		return nil, err
	}
	// Every archive's index is held until the build ends: their entries
	// are bounded together as one archive's are.
	if r.entries += len(ar.entries); r.entries > MaxContextEntries {
		return nil, errdefs.InvalidField("dockerfile", "ADD %s: the build's archives have more than %d entries in all", e.Path, MaxContextEntries)
	}
	return ar, nil
}

// isTarHeader reports whether the first 512 bytes of a stream are a tar
// header: the ustar magic, or an old-style header whose checksum
// matches.
func isTarHeader(b []byte) bool {
	if len(b) < 512 {
		return false
	}
	if bytes.Equal(b[257:262], []byte("ustar")) {
		return true
	}
	want, err := strconv.ParseUint(strings.TrimRight(strings.TrimSpace(string(bytes.TrimRight(b[148:156], "\x00 "))), "\x00"), 8, 32)
	if err != nil {
		return false
	}
	var sum uint64
	for i, c := range b[:512] {
		if i >= 148 && i < 156 {
			c = ' '
		}
		sum += uint64(c)
	}
	return sum == want
}
