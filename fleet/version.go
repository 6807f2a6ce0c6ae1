package fleet

import (
	"strconv"
	"strings"
)

// Compatible reports whether a host running forkbox version other may
// take placements from a host running mine: the fleet's version rule.
//
// Release versions ("v1.4.2", "1.4.2", with any "-pre" or "+build"
// suffix) are compatible when their major and minor numbers are equal: a
// patch release changes no record or wire format, so a fleet can be
// upgraded one host at a time within a minor version. Across minor
// versions a host is listed (forkbox hosts shows it) but never chosen
// for placement, nor does it get sessions routed to it. Versions that
// are not releases ("dev", "dev+3f2a1b9c": plain builds) are compatible
// only with exactly the same string, since nothing says what changed
// between two of them. An empty version is compatible with nothing.
func Compatible(mine, other string) bool {
	if mine == "" || other == "" {
		return false
	}
	ma, mi, ok1 := majorMinor(mine)
	oa, oi, ok2 := majorMinor(other)
	if ok1 && ok2 {
		return ma == oa && mi == oi
	}
	return mine == other
}

// majorMinor parses the major and minor numbers of a release version
// "[v]MAJOR.MINOR.PATCH[-pre][+build]"; ok is false for anything else.
func majorMinor(v string) (major, minor int, ok bool) {
	v = strings.TrimPrefix(v, "v")
	if i := strings.IndexAny(v, "-+"); i >= 0 {
		v = v[:i]
	}
	parts := strings.Split(v, ".")
	if len(parts) != 3 {
		return 0, 0, false
	}
	var n [3]int
	for i, p := range parts {
		x, err := strconv.Atoi(p)
		if err != nil || x < 0 || p == "" || (len(p) > 1 && p[0] == '0') {
			return 0, 0, false
		}
		n[i] = x
	}
	return n[0], n[1], true
}
