package changes

import (
	"bytes"
	"errors"

	udiff "github.com/aymanbagabas/go-udiff"

	"github.com/forkbox/forkbox/errdefs"
)

// MaxPatchFileBytes is the largest file (either side) Patch renders, in
// bytes; a larger one is named TooLarge.
const MaxPatchFileBytes = 1 << 20

// FilePatch is the unified diff of one changed regular file, or why there
// is none.
type FilePatch struct {
	// Text is the unified diff ("--- a/path", "+++ b/path", hunks with 3
	// lines of context); empty when Binary or TooLarge.
	Text string
	// Binary is set when either side holds a NUL byte (git's rule for
	// binary content) or is not a regular file.
	Binary bool
	// TooLarge is set when either side is larger than MaxPatchFileBytes.
	TooLarge bool
}

// IsBinary reports whether b looks binary: a NUL byte within its first
// 8000 bytes (the heuristic git uses).
func IsBinary(b []byte) bool {
	return bytes.IndexByte(b[:min(len(b), 8000)], 0) >= 0
}

// Patch renders change c from tree old to tree new as a unified diff. It
// only reads the files (through Tree.ReadFile: beneath the roots, no
// symlink followed); a side that is not a regular file counts as empty
// when absent and as binary otherwise.
func Patch(old, new *Tree, c Change) (FilePatch, error) {
	var a, b []byte
	for _, side := range []struct {
		t   *Tree
		e   *Entry
		dst *[]byte
	}{{old, c.Old, &a}, {new, c.New, &b}} {
		if side.e == nil {
			continue
		}
		if side.e.Kind != KindFile {
			if side.e.Kind == KindDir {
				continue // a directory's side of a kind change holds no text
			}
			return FilePatch{Binary: true}, nil
		}
		if side.e.Size > MaxPatchFileBytes {
			return FilePatch{TooLarge: true}, nil
		}
		data, err := side.t.ReadFile(c.Path, MaxPatchFileBytes)
		if errors.Is(err, errdefs.ErrResourceExhausted) {
			return FilePatch{TooLarge: true}, nil
		}
		if err != nil {
			return FilePatch{}, err
		}
		if IsBinary(data) {
			return FilePatch{Binary: true}, nil
		}
		*side.dst = data
	}
	from, to := "a/"+c.Path, "b/"+c.Path
	if c.Old == nil || c.Old.Kind != KindFile {
		from = "/dev/null"
	}
	if c.New == nil || c.New.Kind != KindFile {
		to = "/dev/null"
	}
	edits := udiff.Lines(string(a), string(b))
	if len(edits) == 0 {
		return FilePatch{}, nil
	}
	text, err := udiff.ToUnified(from, to, string(a), edits, 3)
	if err != nil {
		return FilePatch{}, err
	}
	return FilePatch{Text: text}, nil
}
