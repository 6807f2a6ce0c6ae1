package image

import (
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// pickOne returns the single element of picked, treating elements with the
// same key as one image. None is an "unknown ref" error, several are an
// "ambiguous" (or, for ref "", "several images") error; all
// errdefs.ErrInvalidArgument.
func pickOne[T any](picked []T, ref string, key func(T) string) (T, error) {
	var zero T
	if len(picked) == 0 {
		if ref == "" {
			return zero, invalidf("source holds no image")
		}
		return zero, invalidf("no image named %q in source", ref)
	}
	for _, p := range picked[1:] {
		if key(p) != key(picked[0]) {
			if ref == "" {
				return zero, invalidf("source holds several images; name one")
			}
			return zero, invalidf("image name %q is ambiguous in source", ref)
		}
	}
	return picked[0], nil
}

// matchesAny reports whether ref names one of cands (empty candidates never
// match): equal strings, equal normalized tags ("python" ==
// "docker.io/library/python:latest"), or a candidate that is a bare tag
// ("3.12") equal to ref's tag.
func matchesAny(ref string, cands ...string) bool {
	rt, rerr := name.NewTag(ref)
	for _, c := range cands {
		switch {
		case c == "":
			continue
		case c == ref:
			return true
		case rerr != nil:
			continue
		}
		if ct, err := name.NewTag(c); err == nil && ct.Name() == rt.Name() {
			return true
		}
		if !strings.ContainsAny(c, ":/@") && c == rt.TagStr() {
			return true
		}
	}
	return false
}
