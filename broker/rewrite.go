package broker

import (
	"net/http"
	"strings"
)

// Binding is one secret as a session holds it: its placeholder and where
// the value may go. The value itself is looked up at request time (Lookup),
// so a revoked secret or an ended session stops at once.
type Binding struct {
	// Name is the secret's name.
	Name string
	// Placeholder is the session's random stand-in (NewPlaceholder).
	Placeholder string
	// Hosts are the secret's hosts (as Validate returns them).
	Hosts []string
	// Header is the secret's header template, or "".
	Header string
}

// Allows reports whether host (lower-case, no port) is one of b's hosts.
func (b Binding) Allows(host string) bool {
	for _, h := range b.Hosts {
		if h == host {
			return true
		}
	}
	return false
}

// Rewrite prepares the headers h of one request bound for host over TLS:
// for each binding whose placeholder it finds in a header value, or whose
// template names a header, it puts in the value lookup returns. A binding
// for another host is left as it is (the placeholder goes out unreplaced)
// and its name is returned in stray, for the record. lookup returns the
// secret's current value, or ok false when the secret was removed (or no
// longer lists host); such a
// binding is left unreplaced and returned in revoked. used names the
// bindings whose value was put in.
func Rewrite(h http.Header, host string, bs []Binding, lookup func(name string) (value []byte, ok bool)) (used, stray, revoked []string) {
	for _, b := range bs {
		present := false
		for _, vs := range h {
			for _, v := range vs {
				present = present || strings.Contains(v, b.Placeholder)
			}
		}
		if !b.Allows(host) {
			if present {
				stray = append(stray, b.Name)
			}
			continue
		}
		name, tmpl, _ := strings.Cut(b.Header, ":")
		if !present && b.Header == "" {
			continue
		}
		v, ok := lookup(b.Name)
		if !ok {
			revoked = append(revoked, b.Name)
			continue
		}
		for k, vs := range h {
			for i := range vs {
				vs[i] = strings.ReplaceAll(vs[i], b.Placeholder, string(v))
			}
			h[k] = vs
		}
		if b.Header != "" {
			h.Set(strings.TrimSpace(name), strings.Replace(strings.TrimSpace(tmpl), "{value}", string(v), 1))
		}
		used = append(used, b.Name)
	}
	return used, stray, revoked
}
