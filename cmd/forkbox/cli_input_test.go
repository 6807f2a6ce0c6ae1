package main

import (
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// testBadInput proves bad arguments and flags end with a message naming
// what is wrong and exit 125, and change nothing on the daemon.
func testBadInput(t *testing.T) {
	before := mustCLI(t, "", "ls", "--all", "--json")
	for _, c := range []struct {
		args []string
		want string // in stderr
	}{
		{[]string{"exec", "", "--", "true"}, "a session id is required"},
		{[]string{"exec", "..", "--", "true"}, `".." is not a session id`},
		{[]string{"rm", ""}, "a session id is required"},
		{[]string{"snapshot", ""}, "a session id is required"},
		{[]string{"fork", ""}, "a session id is required"},
		{[]string{"pause", ""}, "a session id is required"},
		{[]string{"cp", ":/tmp/x", "local"}, "a session id is required"},
		{[]string{"cp", "a", "b"}, "exactly one of SRC and DST must be ID:PATH"},
		{[]string{"exec", "nosuchsession", "--", "true"}, `session "nosuchsession" not found`},
		{[]string{"rm", "nosuchsession"}, `session "nosuchsession" not found`},
		{[]string{"cp", "nosuchsession:rel.txt", "-"}, `session "nosuchsession" not found`},
		{[]string{"--api-key", "fbk_wrong", "ls"}, "the API key was refused (401): set FORKBOX_API_KEY or --api-key"},
		{[]string{"--url", "localhost:7070", "ls"}, `the --url flag: "localhost:7070" is not a daemon URL`},
		{[]string{"exec", "nosuchsession"}, "requires at least 2 arg(s)"},
		{[]string{"exec", "nosuchsession", "--"}, "no command given after the session id"},
		{[]string{"create", "--memory", "lots"}, `invalid argument "lots" for "--memory"`},
		{[]string{"create", "--no-such-flag"}, "unknown flag: --no-such-flag"},
		{[]string{"create", "--memory", "-3"}, "memory"},
		{[]string{"create", "--label", "novalue"}, `--label "novalue": want KEY=VALUE`},
		{[]string{"create", "-e", "=x"}, `--env "=x": missing name`},
		{[]string{"create", "--egress-quota", "5"}, "--egress-quota needs --allow"},
		{[]string{"pool", "set", "base", "many"}, `SIZE "many" is not a number`},
		{[]string{"tenant", "set", "acme"}, "nothing to change"},
		{[]string{"audit", "--since", "yesterday"}, `--since "yesterday": want a duration`},
		{[]string{"no-such-command"}, `unknown command "no-such-command"`},
		{[]string{"serve", "--default-disk-mb", "8"}, "--default-disk-mb 8: must be between 16 and"},
	} {
		_, errOut, code := cli(t, "", c.args...)
		if code != exitForkboxError || !strings.Contains(errOut, c.want) {
			t.Errorf("forkbox %q: exit %d, stderr %q; want 125 and %q", c.args, code, errOut, c.want)
		}
	}
	if after := mustCLI(t, "", "ls", "--all", "--json"); after != before {
		t.Errorf("bad input changed the sessions:\nbefore %s\nafter %s", before, after)
	}
}

func TestSplitRemote(t *testing.T) {
	for in, want := range map[string][3]string{
		"abc:/tmp/x":  {"abc", "/tmp/x", "remote"},
		":/tmp/x":     {"", "/tmp/x", "remote"},
		"/tmp/a:b":    {"", "/tmp/a:b", ""},
		"./a:b":       {"", "./a:b", ""},
		"dir/a:b":     {"", "dir/a:b", ""},
		"plain.txt":   {"", "plain.txt", ""},
		"-":           {"", "-", ""},
		"abc:rel/x":   {"abc", "rel/x", "remote"},
		"abc:/a:b/c:": {"abc", "/a:b/c:", "remote"},
	} {
		id, path, ok := splitRemote(in)
		if got := [3]string{id, path, map[bool]string{true: "remote"}[ok]}; got != want {
			t.Errorf("splitRemote(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseEnv(t *testing.T) {
	t.Setenv("FORKBOX_TEST_FROM_HOST", "host value")
	env, err := parseEnv([]string{"A=1", "B=", "C=x=y", "FORKBOX_TEST_FROM_HOST"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"A": "1", "B": "", "C": "x=y", "FORKBOX_TEST_FROM_HOST": "host value"}
	if len(env) != len(want) {
		t.Fatalf("parseEnv: %v, want %v", env, want)
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("parseEnv: %s=%q, want %q", k, env[k], v)
		}
	}
	if env, err := parseEnv(nil); env != nil || err != nil {
		t.Errorf("parseEnv(nil) = %v, %v", env, err)
	}
	if _, err := parseEnv([]string{"=v"}); err == nil {
		t.Error("parseEnv accepted an empty name")
	}
}

func TestParseSince(t *testing.T) {
	if got, err := parseSince("since", ""); err != nil || !got.IsZero() {
		t.Errorf(`parseSince(""): %v, %v; want the zero time`, got, err)
	}
	got, err := parseSince("since", "1h")
	if d := time.Since(got) - time.Hour; err != nil || d < 0 || d > time.Minute {
		t.Errorf("parseSince(1h): %v, %v; want an hour ago", got, err)
	}
	if got, err := parseSince("since", "2024-05-01T12:00:00Z"); err != nil || !got.Equal(time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)) {
		t.Errorf("parseSince(RFC 3339): %v, %v", got, err)
	}
	for _, bad := range []string{"-1h", "yesterday", "2024-05-01"} {
		if _, err := parseSince("until", bad); err == nil || !strings.Contains(err.Error(), "--until") {
			t.Errorf("parseSince(%q): %v, want an error naming --until", bad, err)
		}
	}
}

func TestBytesText(t *testing.T) {
	for n, want := range map[int64]string{0: "0B", 1023: "1023B", 1024: "1.0KiB", 1536: "1.5KiB", 5 << 20: "5.0MiB", 3 << 30: "3.0GiB"} {
		if got := bytesText(n); got != want {
			t.Errorf("bytesText(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestPolicyFlagsRoundUp(t *testing.T) {
	f := policyFlags{maxTimeout: 1500 * time.Millisecond}
	if p, err := f.policy(); err != nil || p.MaxTimeoutS != 2 {
		t.Errorf("policy of --max-timeout 1.5s: %+v, %v; want 2 s (a sub-second rest must not become no limit)", p, err)
	}
	f.maxTimeout = -time.Second
	if _, err := f.policy(); err == nil {
		t.Error("policy accepted a negative --max-timeout")
	}
}

// TestUnreachableDaemon proves a command against a port nothing listens
// on says which daemon it could not reach and exits 125.
func TestUnreachableDaemon(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	l.Close()
	_, errOut, code := cli(t, "", "--url", url, "--api-key", "k", "rm", "x")
	want := "cannot reach the forkbox daemon at " + url + ": is `forkbox serve` running?"
	if code != exitForkboxError || !strings.Contains(errOut, want) {
		t.Fatalf("rm against a closed port: exit %d, stderr %q; want 125 and %q", code, errOut, want)
	}
}

func TestUploadText(t *testing.T) {
	for _, c := range []struct {
		sent, total int64
		done        bool
		want        string
	}{
		{512 << 10, 2 << 20, false, "img.tar: uploading 512.0KiB of 2.0MiB (25%)"},
		{3 << 20, -1, false, "img.tar: uploading 3.0MiB"},
		{2 << 20, 2 << 20, true, "img.tar: sent 2.0MiB; unpacking the image's layers on the daemon..."},
	} {
		if got := uploadText("img.tar", c.sent, c.total, c.done); got != c.want {
			t.Errorf("uploadText(%d, %d, %v) = %q, want %q", c.sent, c.total, c.done, got, c.want)
		}
	}
	var b strings.Builder
	p := &progressLine{w: &b}
	p.show("one", true)
	p.show("two", false) // within progressEvery of the first: not drawn
	p.done()
	if b.String() != "\rone\x1b[K\r\x1b[K" {
		t.Errorf("progress line wrote %q", b.String())
	}
	r, w, _ := os.Pipe()
	defer r.Close()
	defer w.Close()
	if isTerminal(w) || isTerminal(&b) {
		t.Error("a pipe or a buffer is taken for a terminal")
	}
}

// TestParseForward: LOCAL:REMOTE, or REMOTE alone for the same number on
// both sides; LOCAL 0 picks a free port; the sandbox port is 1-65535.
func TestParseForward(t *testing.T) {
	for _, c := range []struct {
		in            string
		local, remote int
	}{{"8000:3000", 8000, 3000}, {"5432", 5432, 5432}, {"0:80", 0, 80}} {
		l, r, err := parseForward(c.in)
		if err != nil || l != c.local || r != c.remote {
			t.Errorf("%q: %d %d %v", c.in, l, r, err)
		}
	}
	for _, bad := range []string{"", "0", "8000:0", "8000:70000", "a:80", "80:b", "-1:80", "70000:80"} {
		if _, _, err := parseForward(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
