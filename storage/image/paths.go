package image

import (
	"path/filepath"
	"regexp"
	"strings"
)

// pathError is an import error whose message names paths relative to the
// image instead of where the import happens on the host; it unwraps to the
// original error, so its errdefs class is unchanged.
type pathError struct {
	err error
	msg string
}

// Error returns the message with image-relative paths.
func (e *pathError) Error() string { return e.msg }

// Unwrap returns the original error.
func (e *pathError) Unwrap() error { return e.err }

// pathEnd matches the rest of a path after a root: more path characters
// (anything but the quotes, spaces and colons that end a path in an error
// message).
const pathEnd = `((?:/[^\s"':]*)?)`

// relativeError rewrites err's message so that it names no host path: a
// path under rootfs becomes the path in the image ("/etc/hosts"), a path
// in the temporary copy of an OCI layout (a ".image-oci-*" directory
// under tmpParent) or in a layout directory src becomes the layout's own
// ("blobs/sha256/..."), src itself "the image archive", and anything else
// under tmpParent "the import directory". The full error belongs in the
// daemon's log, which the caller writes.
func relativeError(err error, src, rootfs, tmpParent string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	type rule struct {
		re   *regexp.Regexp
		repl func(rest string) string
	}
	inLayout := func(rest string) string {
		if rest = strings.TrimPrefix(rest, "/"); rest == "" {
			return "the OCI layout"
		}
		return rest
	}
	rules := []rule{
		{regexp.MustCompile(regexp.QuoteMeta(filepath.Clean(tmpParent)) + `/\.image-oci-[^/\s"':]*` + pathEnd), inLayout},
		{regexp.MustCompile(regexp.QuoteMeta(filepath.Clean(rootfs)) + pathEnd), func(rest string) string {
			if rest == "" {
				return "/"
			}
			return rest
		}},
		{regexp.MustCompile(regexp.QuoteMeta(filepath.Clean(src)) + pathEnd), func(rest string) string {
			if rest == "" {
				return "the image archive"
			}
			return inLayout(rest)
		}},
		{regexp.MustCompile(regexp.QuoteMeta(filepath.Clean(tmpParent)) + pathEnd), func(string) string {
			return "the import directory"
		}},
	}
	for _, r := range rules {
		msg = r.re.ReplaceAllStringFunc(msg, func(m string) string {
			return r.repl(r.re.FindStringSubmatch(m)[1])
		})
	}
	if msg == err.Error() {
		return err
	}
	return &pathError{err: err, msg: msg}
}
