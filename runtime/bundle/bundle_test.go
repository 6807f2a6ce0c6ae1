package bundle

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// TestWriteSpec: the spec is written whole as config.json, readable by
// root only, and a second write replaces the first.
func TestWriteSpec(t *testing.T) {
	dir := t.TempDir()
	if err := WriteSpec(dir, &specs.Spec{Version: specs.Version, Hostname: "first"}); err != nil {
		t.Fatal(err)
	}
	if err := WriteSpec(dir, &specs.Spec{Version: specs.Version, Hostname: "second"}); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, SpecFile)
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	var got specs.Spec
	b, _ := os.ReadFile(p)
	if err := json.Unmarshal(b, &got); err != nil || got.Hostname != "second" || got.Version != specs.Version {
		t.Fatalf("read back %+v %v", got, err)
	}
	if err := WriteSpec(filepath.Join(dir, "missing"), &specs.Spec{}); err == nil {
		t.Error("a missing directory was accepted")
	}
}

// TestAgentStdio runs a real process with the agent's stdio: it reads
// EOF on stdin, both its streams land in the log, a reopened log is
// appended to, and Tail returns the end of it.
func TestAgentStdio(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh to run")
	}
	dir := t.TempDir()
	run := func(script string) {
		t.Helper()
		s, err := OpenAgentStdio(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if s.Stdin() != nil || s.Stdout() != nil || s.Stderr() != nil {
			t.Fatal("the go-runc pipes are not nil")
		}
		cmd := exec.Command(sh, "-c", script)
		s.Set(cmd)
		if err := cmd.Run(); err != nil {
			t.Fatal(err)
		}
	}
	run(`echo out; echo err >&2; cat; echo "stdin gave $?"`)
	run(`echo again`)
	b, err := os.ReadFile(filepath.Join(dir, LogFile))
	if err != nil {
		t.Fatal(err)
	}
	if want := "out\nerr\nstdin gave 0\nagain\n"; string(b) != want {
		t.Fatalf("log %q, want %q", b, want)
	}
	fi, _ := os.Stat(filepath.Join(dir, LogFile))
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("log mode %v, want 0600", fi.Mode().Perm())
	}
	s, err := OpenAgentStdio(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.Tail(7); got != "again" {
		t.Errorf("Tail(7) = %q, want %q", got, "again")
	}
	if got := s.Tail(1 << 20); !strings.HasPrefix(got, "out\n") || !strings.HasSuffix(got, "again") {
		t.Errorf("Tail of the whole log = %q", got)
	}
	if _, err := OpenAgentStdio(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing state directory was accepted")
	}
}
