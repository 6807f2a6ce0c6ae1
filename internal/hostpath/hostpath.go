// Package hostpath keeps the daemon's host paths out of what API clients
// read. Errors are made relative at their source (the image importer names
// paths in the image, the agent dialer names no socket path); a Redactor at
// each HTTP edge is the net behind that: any path under one of the
// daemon's own roots (its data directory, its checkpoint scratch) left in
// an error's text is replaced before the answer is written, and the edge
// logs the original.
package hostpath

import (
	"path/filepath"
	"regexp"
	"strings"
)

// Hidden replaces a host path in a message.
const Hidden = "(a forkbox host path)"

// Redactor replaces paths under a fixed set of host directories. The zero
// value and nil redact nothing. It is safe for concurrent use.
type Redactor struct {
	roots []*regexp.Regexp
}

// New returns a Redactor for the absolute directories roots ("" and
// relative entries are ignored).
func New(roots ...string) *Redactor {
	r := &Redactor{}
	for _, root := range roots {
		if root == "" || !filepath.IsAbs(root) {
			continue
		}
		root = filepath.Clean(root)
		// The root, then the rest of the path: anything up to a space, a
		// quote or a colon (what ends a path in an error message).
		r.roots = append(r.roots, regexp.MustCompile(regexp.QuoteMeta(root)+`([^\s"':]*)`))
	}
	return r
}

// Redact returns msg with every path under a root replaced by Hidden, and
// whether it replaced any. "/data/sandboxes/x/agent.sock" is hidden for
// the root "/data"; "/database" is not (a root matches whole path
// segments only).
func (r *Redactor) Redact(msg string) (string, bool) {
	if r == nil {
		return msg, false
	}
	changed := false
	for _, re := range r.roots {
		msg = re.ReplaceAllStringFunc(msg, func(m string) string {
			rest := re.FindStringSubmatch(m)[1]
			if rest != "" && !strings.HasPrefix(rest, "/") {
				return m // another name that starts like the root
			}
			changed = true
			return Hidden
		})
	}
	return msg, changed
}
