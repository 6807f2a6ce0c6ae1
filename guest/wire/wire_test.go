package wire

import (
	"encoding/json"
	"net/http"
	"testing"
)

// TestJSONNames pins the JSON encoding of every message: a daemon and the
// agents it started (also ones restored from checkpoints an older daemon
// made) must read each other's bodies, and InitRequest must keep envd's
// names.
func TestJSONNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		v    any
		want string
	}{
		{"Config", Config{DefaultUser: "user", Workdir: "/w", Env: map[string]string{"A": "1"}, Path: "/bin"},
			`{"default_user":"user","workdir":"/w","env":{"A":"1"},"path":"/bin"}`},
		{"Config empty", Config{}, `{"default_user":""}`},
		{"InitRequest", InitRequest{EnvVars: map[string]string{"A": "1"}, DefaultUser: "root", DefaultWorkdir: "/tmp"},
			`{"envVars":{"A":"1"},"defaultUser":"root","defaultWorkdir":"/tmp"}`},
		{"InitRequest empty", InitRequest{}, `{}`},
		{"StageReply", StageReply{ID: "s1", Size: 70000}, `{"id":"s1","size":70000}`},
		{"PrepareRequest", PrepareRequest{Generation: 7}, `{"generation":7}`},
		{"ResumeFile", ResumeFile{Generation: 7, Hostname: "abc"}, `{"generation":7,"hostname":"abc"}`},
		{"ResumeFile no hostname", ResumeFile{}, `{"generation":0}`},
	} {
		b, err := json.Marshal(tc.v)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if string(b) != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, b, tc.want)
		}
	}
}

// TestHeaderNames: headers and trailers are already in canonical form
// (net/http canonicalises what it sends and receives, and trailers are
// looked up by these exact strings), carry forkbox's prefix (the envd
// proxy drops Forkbox-* headers) and are distinct.
func TestHeaderNames(t *testing.T) {
	seen := map[string]bool{}
	for _, h := range []string{ScriptHeader, StdinHeader, KeepStdinHeader, CollectHeader,
		CPUTrailer, DurationTrailer, TruncatedTrailer} {
		if http.CanonicalHeaderKey(h) != h {
			t.Errorf("%q is not canonical (%q)", h, http.CanonicalHeaderKey(h))
		}
		if len(h) < 8 || h[:8] != "Forkbox-" {
			t.Errorf("%q lacks the Forkbox- prefix", h)
		}
		if seen[h] {
			t.Errorf("%q is used twice", h)
		}
		seen[h] = true
	}
}
