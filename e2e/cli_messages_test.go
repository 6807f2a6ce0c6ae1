package e2e

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// forkboxEnv is forkbox with environment variables extra set for the
// command (they override FORKBOX_URL and FORKBOX_API_KEY).
func forkboxEnv(t *testing.T, extra []string, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(env.cli, args...)
	cmd.Env = append(append(os.Environ(), "FORKBOX_URL="+env.d.URL, "FORKBOX_API_KEY="+env.key), extra...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return out.String(), errOut.String(), ee.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), 0
}

// TestCLIMessages proves the CLI says what happened, and exits 125, for an
// unknown session (rm, exec, cp both ways, pause), an unreachable daemon
// (--url to a closed port) and a refused key (from FORKBOX_API_KEY and
// from --api-key), and that the root help names the settings.
func TestCLIMessages(t *testing.T) {
	need(t)
	local := filepath.Join(t.TempDir(), "f.txt")
	os.WriteFile(local, []byte("x\n"), 0o644)
	for _, args := range [][]string{
		{"rm", "nosuchsession"},
		{"exec", "nosuchsession", "--", "true"},
		{"cp", "nosuchsession:f.txt", t.TempDir()},
		{"cp", local, "nosuchsession:f.txt"},
		{"pause", "nosuchsession"},
	} {
		_, errOut, code := forkbox(t, "", args...)
		if code != 125 || !strings.Contains(errOut, `session "nosuchsession" not found`) || strings.Contains(errOut, "HTTP 404") {
			t.Errorf("forkbox %s: exit %d, stderr %q; want 125 and `session \"nosuchsession\" not found`",
				strings.Join(args, " "), code, errOut)
		}
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + l.Addr().String()
	l.Close()
	_, errOut, code := forkbox(t, "", "--url", closed, "ls")
	want := "cannot reach the forkbox daemon at " + closed + ": is `forkbox serve` running?"
	if code != 125 || !strings.Contains(errOut, want) {
		t.Errorf("ls with --url to a closed port: exit %d, stderr %q; want 125 and %q", code, errOut, want)
	}
	// --url wins over FORKBOX_URL, which the helper sets to the live daemon.
	_, errOut, code = forkboxEnv(t, []string{"FORKBOX_URL=" + closed}, "--url", env.d.URL, "ls")
	if code != 0 {
		t.Errorf("ls with --url to the daemon and FORKBOX_URL to a closed port: exit %d, %s", code, errOut)
	}

	_, errOut, code = forkboxEnv(t, []string{"FORKBOX_API_KEY=fbk_not_a_key"}, "ls")
	if code != 125 || !strings.Contains(errOut, "the API key was refused (401)") || !strings.Contains(errOut, "read from FORKBOX_API_KEY") {
		t.Errorf("ls with a bad FORKBOX_API_KEY: exit %d, stderr %q", code, errOut)
	}
	_, errOut, code = forkbox(t, "", "--api-key", "fbk_not_a_key", "ls")
	if code != 125 || !strings.Contains(errOut, "the API key was refused (401)") || !strings.Contains(errOut, "read from the --api-key flag") {
		t.Errorf("ls with a bad --api-key: exit %d, stderr %q", code, errOut)
	}

	help, _, _ := forkbox(t, "", "--help")
	for _, w := range []string{"FORKBOX_URL", "FORKBOX_API_KEY", "--url", "--api-key", "/var/lib/forkbox/api-key", "125"} {
		if !strings.Contains(help, w) {
			t.Errorf("forkbox --help does not name %s:\n%s", w, help)
		}
	}
}

// TestCLICpRelative proves cp takes a relative sandbox path from the
// session's working directory (the user's home here, where exec runs),
// both ways and for ID: alone, and that an error names the user's path,
// never the agent's temporary file.
func TestCLICpRelative(t *testing.T) {
	need(t)
	out, errOut, code := forkbox(t, "", "create")
	if code != 0 {
		t.Fatalf("create: %d %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	defer forkbox(t, "", "rm", id)
	dir := t.TempDir()
	local := filepath.Join(dir, "rel.txt")
	os.WriteFile(local, []byte("relative\n"), 0o644)
	for _, dst := range []string{id + ":rel.txt", id + ":", id + ":sub/"} {
		if _, errOut, code := forkbox(t, "", "cp", local, dst); code != 0 {
			t.Fatalf("cp %s: %d %s", dst, code, errOut)
		}
	}
	out, _, code = forkbox(t, "", "exec", id, "--", "sh", "-c", "pwd; cat /home/user/rel.txt /home/user/sub/rel.txt")
	if code != 0 || out != "/home/user\nrelative\nrelative\n" {
		t.Fatalf("after cp to relative paths: %d %q", code, out)
	}
	forkbox(t, "", "exec", id, "--", "sh", "-c", "echo made inside > out.txt")
	back := t.TempDir()
	if _, errOut, code := forkbox(t, "", "cp", id+":out.txt", back); code != 0 {
		t.Fatalf("cp ID:out.txt DIR: %d %s", code, errOut)
	}
	if b, _ := os.ReadFile(filepath.Join(back, "out.txt")); string(b) != "made inside\n" {
		t.Fatalf("copied out %q", b)
	}
	_, errOut, code = forkbox(t, "", "cp", local, id+":/rel.txt")
	if code != 125 || !strings.Contains(errOut, "/rel.txt") || strings.Contains(errOut, ".forkbox-upload") {
		t.Fatalf("cp into the read-only /: exit %d, stderr %q; want 125 naming /rel.txt and no temporary file", code, errOut)
	}
}

// TestCLIHelpExamples runs the examples of `forkbox snapshot --help` and
// `forkbox fork --help` as the shell scripts they are, with this forkbox
// first in PATH, and destroys what they leave.
func TestCLIHelpExamples(t *testing.T) {
	need(t)
	for _, command := range []string{"snapshot", "fork"} {
		t.Run(command, func(t *testing.T) {
			before := liveIDs(t)
			defer func() {
				for id := range liveIDs(t) {
					if !before[id] {
						forkbox(t, "", "rm", id)
					}
				}
			}()
			help, _, _ := forkbox(t, "", command, "--help")
			m := regexp.MustCompile(`(?s)\nExamples:\n(.*?)\n\n`).FindStringSubmatch(help)
			if m == nil {
				t.Fatalf("forkbox %s --help has no examples:\n%s", command, help)
			}
			cmd := exec.Command("sh", "-e", "-c", m[1])
			cmd.Env = append(os.Environ(), "FORKBOX_URL="+env.d.URL, "FORKBOX_API_KEY="+env.key,
				"PATH="+filepath.Dir(env.cli)+":"+os.Getenv("PATH"))
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "hello") {
				t.Fatalf("the examples of forkbox %s --help:\n%s\nfailed: %v\n%s", command, m[1], err, out)
			}
		})
	}
}

// liveIDs returns the ids of the sessions that have not ended.
func liveIDs(t *testing.T) map[string]bool {
	t.Helper()
	out, _, _ := forkbox(t, "", "ls", "--json")
	var ss []struct {
		ID string `json:"id"`
	}
	json.Unmarshal([]byte(out), &ss)
	ids := map[string]bool{}
	for _, s := range ss {
		ids[s.ID] = true
	}
	return ids
}
