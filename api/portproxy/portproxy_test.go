package portproxy

import (
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// TestParseHost: only "PORT-ID.DOMAIN" directly under the domain, with an
// id of the shape sessions have, is a port host; the port is returned as
// text for ParsePort.
func TestParseHost(t *testing.T) {
	const id = "abcdefghij0123456789"
	for _, c := range []struct {
		host, domain, port, id string
		ok                     bool
	}{
		{"8000-" + id + ".sbx.example.com", "sbx.example.com", "8000", id, true},
		{"8000-" + id + ".SBX.example.com:7070", "sbx.example.com", "8000", id, true},
		{"8000-" + id + ".sbx.example.com.", "sbx.example.com", "8000", id, true},
		{"abc-" + id + ".sbx.example.com", "sbx.example.com", "abc", id, true},
		{"8000-" + id + ".sbx.example.com", "", "", "", false},
		{"8000-" + id + ".other.com", "sbx.example.com", "", "", false},
		{"x.8000-" + id + ".sbx.example.com", "sbx.example.com", "", "", false},
		{"8000-short.sbx.example.com", "sbx.example.com", "", "", false},
		{"8000" + id + ".sbx.example.com", "sbx.example.com", "", "", false},
		{"sbx.example.com", "sbx.example.com", "", "", false},
		{"-" + id + ".sbx.example.com", "sbx.example.com", "", "", false},
	} {
		port, gotID, ok := ParseHost(c.host, c.domain)
		if port != c.port || gotID != c.id || ok != c.ok {
			t.Errorf("ParseHost(%q, %q) = %q %q %v, want %q %q %v", c.host, c.domain, port, gotID, ok, c.port, c.id, c.ok)
		}
	}
}

// TestParsePort: 1-65535 in plain decimal; anything else a field error on
// "port".
func TestParsePort(t *testing.T) {
	for _, s := range []string{"1", "80", "65535"} {
		if _, err := ParsePort(s); err != nil {
			t.Errorf("%s: %v", s, err)
		}
	}
	for _, s := range []string{"0", "65536", "70000", "-1", "abc", "", "080", "+80", " 80"} {
		if _, err := ParsePort(s); errdefs.Field(err) != "port" {
			t.Errorf("%q: %v, want a field error on port", s, err)
		}
	}
}
