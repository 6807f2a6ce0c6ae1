package build

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"slices"
	"sort"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

// MaxContextEntries bounds the entries of a build context.
const MaxContextEntries = 100_000

// maxPathBytes bounds an entry's name and link target in a build context
// or an archive ADD extracts, in bytes: Linux's PATH_MAX (4096, with its
// terminating NUL), beyond which no file could be made by that name.
const maxPathBytes = 4096

// maxID is the largest user or group id an archive entry may name:
// Linux's ids are 32-bit, and 4294967295 is (uid_t)-1, "no id".
const maxID int64 = 1<<32 - 2

// Context is a build context: a tar the client uploaded, spooled in a
// file, indexed by clean relative path. Its entries are never written
// on the host: COPY reads a regular file's bytes from the spool and
// writes them into the sandbox, so no entry (a symlink, "..", an
// absolute name) can reach a host path; names that would leave the
// context are refused when it is opened.
type Context struct {
	f       *os.File
	entries map[string]*Entry
}

// Entry is one file of a Context.
type Entry struct {
	// Path is clean and relative ("dir/file"); "." is the root.
	Path string
	// Type is tar.TypeReg, tar.TypeDir or tar.TypeSymlink.
	Type byte
	Mode int64
	Size int64
	// Link is a symlink's target (as written; it is recreated in the
	// sandbox, never followed on the host).
	Link string
	// Digest is the sha256 of a regular file's bytes (hex).
	Digest string
	// UID and GID are an extracted archive entry's owner (0 in a build
	// context: COPY writes as root or --chown).
	UID, GID int
	offset   int64
}

// OpenContext indexes the tar in f (which it keeps open until Close;
// nil f: an empty context). Hard links become copies of their target;
// device nodes, FIFOs and sockets are refused. Errors are
// ErrInvalidArgument naming the field "context": a name with ".." or
// absolute, an entry of another type, more than MaxContextEntries, or
// not a tar.
func OpenContext(f *os.File) (*Context, error) {
	return openTar(f, "context", false)
}

// openTar indexes the tar in f as OpenContext says; with archive (a
// local archive ADD extracts) it follows the image extractor's rules
// instead (storage/image): leading slashes are dropped, a ".." anywhere
// in a name is refused, device nodes and FIFOs are dropped, setuid and
// setgid bits are cleared, and each entry keeps its owner (UID, GID);
// an entry under a symlink the archive made is refused (it would be
// written through the link). Errors name field.
func openTar(f *os.File, field string, archive bool) (*Context, error) {
	c := &Context{f: f, entries: map[string]*Entry{".": {Path: ".", Type: tar.TypeDir, Mode: 0o755}}}
	if f == nil {
		return c, nil
	}
	cr := &countingReader{r: f}
	tr := tar.NewReader(cr)
	links := 0 // symlinks so far: entries under one are refused
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, errdefs.InvalidField(field, "not a tar archive: %v", err)
		}
		if len(c.entries) > MaxContextEntries {
			return nil, errdefs.InvalidField(field, "more than %d entries", MaxContextEntries)
		}
		if archive && h.Typeflag == tar.TypeXGlobalHeader {
			continue
		}
		if len(h.Name) > maxPathBytes || len(h.Linkname) > maxPathBytes {
			// Each component of a longer name would be made a parent
			// entry below, in time quadratic in its length.
			return nil, errdefs.InvalidField(field, "entry %.64q...: its name or link is too long (more than %d bytes, Linux's PATH_MAX)", h.Name, maxPathBytes)
		}
		name := strings.TrimSuffix(h.Name, "/")
		if archive {
			if slices.Contains(strings.Split(name, "/"), "..") {
				return nil, errdefs.InvalidField(field, "entry %q leaves the destination", h.Name)
			}
			name = strings.TrimLeft(name, "/")
			if name == "" {
				name = "."
			}
		}
		clean := path.Clean(name)
		if path.IsAbs(name) || clean == ".." || strings.HasPrefix(clean, "../") {
			return nil, errdefs.InvalidField(field, "entry %q leaves the context", h.Name)
		}
		if archive && links > 0 {
			for d := path.Dir(clean); d != "."; d = path.Dir(d) {
				if p, ok := c.entries[d]; ok && p.Type == tar.TypeSymlink {
					return nil, errdefs.InvalidField(field, "entry %q is under the symlink %q", h.Name, d)
				}
			}
		}
		e := &Entry{Path: clean, Mode: h.Mode & 0o7777, Size: h.Size}
		if archive {
			if h.Uid < 0 || h.Gid < 0 || int64(h.Uid) > maxID || int64(h.Gid) > maxID {
				return nil, errdefs.InvalidField(field, "entry %q: owner %d:%d is not a Linux user and group id", h.Name, h.Uid, h.Gid)
			}
			e.Mode &= 0o1777
			e.UID, e.GID = h.Uid, h.Gid
		}
		switch h.Typeflag {
		case tar.TypeReg:
			for k := range h.PAXRecords {
				if strings.HasPrefix(k, "GNU.sparse.") {
					return nil, errdefs.InvalidField(field, "entry %q: sparse files are not allowed", h.Name)
				}
			}
			e.Type, e.offset = tar.TypeReg, cr.n
			sum := sha256.New()
			if _, err := io.Copy(sum, tr); err != nil {
				return nil, errdefs.InvalidField(field, "entry %q: %v", h.Name, err)
			}
			e.Digest = hex.EncodeToString(sum.Sum(nil))
		case tar.TypeDir:
			e.Type = tar.TypeDir
		case tar.TypeSymlink:
			e.Type, e.Link = tar.TypeSymlink, h.Linkname
			links++
		case tar.TypeLink:
			target, ok := c.entries[path.Clean(strings.TrimLeft(h.Linkname, "/"))]
			if !ok || target.Type != tar.TypeReg {
				return nil, errdefs.InvalidField(field, "hard link %q to %q, which is not a file before it", h.Name, h.Linkname)
			}
			cp := *target
			cp.Path = clean
			e = &cp
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			if archive {
				continue // dropped, as the image extractor does
			}
			return nil, errdefs.InvalidField(field, "entry %q: only files, directories and symlinks are allowed", h.Name)
		default:
			return nil, errdefs.InvalidField(field, "entry %q: only files, directories and symlinks are allowed", h.Name)
		}
		if archive && clean == "." {
			if e.Type != tar.TypeDir {
				return nil, errdefs.InvalidField(field, "entry %q: the root is not a directory", h.Name)
			}
			continue // the root is the destination; it keeps its own mode
		}
		c.entries[clean] = e
		// Parents an archive left out are directories (an entry's
		// parents are all there once one is: the walk stops at it).
		for d := path.Dir(clean); d != "."; d = path.Dir(d) {
			if _, ok := c.entries[d]; ok {
				break
			}
			c.entries[d] = &Entry{Path: d, Type: tar.TypeDir, Mode: 0o755}
		}
	}
	return c, nil
}

// Close closes the spool file.
func (c *Context) Close() error {
	if c.f == nil {
		return nil
	}
	return c.f.Close()
}

// Open returns a reader of regular file e's bytes.
func (c *Context) Open(e *Entry) io.Reader {
	return io.NewSectionReader(c.f, e.offset, e.Size)
}

// Pick is one context entry a COPY source selected, with the path it
// gets under the destination (Rel: "." for the source directory itself).
type Pick struct {
	E   *Entry
	Rel string
}

// Select returns the entries a COPY source src names, sorted by path: a
// file or symlink (Rel its base name), or a directory's entries (Rel
// relative to it: a directory's contents are copied, as in Docker). The
// source is resolved lexically inside the context ("../x" and "/x" mean
// "x"), never through a symlink. A glob pattern (path.Match) selects
// every entry it matches. dir reports whether the source is one
// directory. An error when nothing matches.
func (c *Context) Select(src string) (picks []Pick, dir bool, err error) {
	clean := strings.TrimPrefix(path.Clean("/"+src), "/")
	if clean == "" {
		clean = "."
	}
	var roots []*Entry
	if strings.ContainsAny(clean, "*?[") {
		for p, e := range c.entries {
			if ok, _ := path.Match(clean, p); ok {
				roots = append(roots, e)
			}
		}
	} else if e, ok := c.entries[clean]; ok {
		roots = append(roots, e)
	}
	if len(roots) == 0 {
		return nil, false, fmt.Errorf("%s: not in the build context", src)
	}
	for _, r := range roots {
		if r.Type != tar.TypeDir {
			picks = append(picks, Pick{E: r, Rel: path.Base(r.Path)})
			continue
		}
		for p, e := range c.entries {
			if r.Path == "." || p == r.Path || strings.HasPrefix(p, r.Path+"/") {
				picks = append(picks, Pick{E: e, Rel: rel(r.Path, p)})
			}
		}
	}
	sort.Slice(picks, func(i, j int) bool { return picks[i].Rel < picks[j].Rel })
	return picks, len(roots) == 1 && roots[0].Type == tar.TypeDir, nil
}

// Digest is the digest of picks (their destination paths, types,
// modes, link targets and content digests): a COPY's inputs in its
// cache key.
func Digest(picks []Pick) string {
	h := sha256.New()
	for _, p := range picks {
		fmt.Fprintf(h, "%q %c %o %q %s\n", p.Rel, p.E.Type, p.E.Mode, p.E.Link, p.E.Digest)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// rel is p relative to base (both clean and relative; "." is the root).
func rel(base, p string) string {
	if base == "." || base == "" {
		return p
	}
	if p == base {
		return "."
	}
	return strings.TrimPrefix(p, base+"/")
}

// countingReader counts the bytes read through it, which is the offset
// of a tar entry's data once tar.Reader.Next returned its header.
type countingReader struct {
	r io.Reader
	n int64
}

// Read reads from the underlying reader and counts.
func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
