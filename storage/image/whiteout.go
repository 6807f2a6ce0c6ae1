package image

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/storage"
)

// Whiteout names (OCI image spec, "Representing Changes").
const (
	whiteoutPrefix = ".wh."         // ".wh.<name>" deletes <name> of lower layers
	whiteoutMeta   = ".wh..wh."     // reserved prefix; entries other than opaque are ignored
	whiteoutOpaque = ".wh..wh..opq" // empties its directory of lower-layer content
)

// markTouched records rel as written by the current layer, and its ancestors
// as holding something written by it, for the whiteout rules.
func (x *extractor) markTouched(rel string) {
	x.touched[rel] = true
	for d, _ := splitRel(rel); d != "" && !x.parents[d]; d, _ = splitRel(d) {
		x.parents[d] = true
	}
}

// whiteout applies the whiteout entry base (".wh.<name>" or the opaque
// marker) in the directory dir: it removes lower-layer content, never entries
// written by the current layer. The directory is resolved inside the rootfs
// like any parent; when it does not exist there is nothing to delete. The
// whiteout itself is never written.
func (x *extractor) whiteout(dir, base string) error {
	pfd, err := x.openParent(dir, false)
	if err == unix.ENOENT || err == unix.ENOTDIR {
		return nil
	}
	if err != nil {
		return fmt.Errorf("whiteout directory: %w", classify(err))
	}
	defer unix.Close(pfd)
	if base == whiteoutOpaque {
		fd, err := unix.Openat(pfd, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return classify(err)
		}
		defer unix.Close(fd)
		return classify(x.removeLowerChildren(fd, dir))
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil // other reserved names (e.g. aufs .wh..wh.plnk) carry no change
	}
	target := strings.TrimPrefix(base, whiteoutPrefix)
	if target == "" || target == "." || target == ".." {
		return invalidf("bad whiteout name %q", base)
	}
	return classify(x.removeLower(pfd, target, joinRel(dir, target)))
}

// removeLower removes what lower layers put at name (lexical path rel) in the
// directory fd dir: everything, unless the current layer wrote rel or
// something below it; then only the lower-layer entries below a directory
// are removed and the current layer's entries stay. Symlinks are never
// followed.
func (x *extractor) removeLower(dir int, name, rel string) error {
	if !x.touched[rel] && !x.parents[rel] {
		return removeAll(dir, name)
	}
	st, ok, err := lstatAt(dir, name)
	if err != nil || !ok || !isDir(&st) {
		return err
	}
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return x.removeLowerChildren(fd, rel)
}

// removeLowerChildren applies removeLower to every entry of the directory
// open at fd, whose lexical path is rel (an opaque whiteout of rel).
func (x *extractor) removeLowerChildren(fd int, rel string) error {
	names, err := storage.ReadDirNames(fd)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := x.removeLower(fd, n, joinRel(rel, n)); err != nil {
			return err
		}
	}
	return nil
}
