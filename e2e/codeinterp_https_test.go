package e2e

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/testnet"
)

// packagesHost is the test host of TestCodeHTTPSPackages: a package index
// (pypi.test) and a git server (git.test) over HTTPS.
const packagesHost = "198.51.100.43"

func init() {
	egressNames["pypi.test"] = []netip.Addr{netip.MustParseAddr(packagesHost)}
	egressNames["git.test"] = []netip.Addr{netip.MustParseAddr(packagesHost)}
}

// TestCodeHTTPSPackages: with an allow-list naming them, a code-interpreter
// sandbox installs a package with pip from a package index over HTTPS
// (PEP 503 simple index, a wheel) and clones a git repository over HTTPS,
// both trusting a bundle of the template's CA certificates (its copy of
// the host's) and the test CA, and going through the egress proxy; the
// running kernel imports what pip installed. A name off the list stays
// unreachable.
func TestCodeHTTPSPackages(t *testing.T) {
	need(t)
	if _, err := exec.LookPath("git"); err != nil {
		skipOrFail(t, "git is not installed: %v", err)
	}
	wheel := testWheel(t)
	repo := testGitRepo(t)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /simple/fbhello/", func(w http.ResponseWriter, r *http.Request) {
		sum := sha256.Sum256(wheel)
		fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="/files/fbhello-0.1-py3-none-any.whl#sha256=%x">fbhello-0.1-py3-none-any.whl</a></body></html>`, sum)
	})
	mux.HandleFunc("GET /files/fbhello-0.1-py3-none-any.whl", func(w http.ResponseWriter, r *http.Request) { w.Write(wheel) })
	mux.Handle("GET /repo.git/", http.StripPrefix("/repo.git/", http.FileServer(http.Dir(repo))))
	host := testnet.NewHost(t, packagesHost)
	host.ServeTLS(t, 443, mux, "pypi.test", "git.test")
	ca := testnetCA(t, host)

	s := newSession(t, client.CreateRequest{Template: "code-interpreter-v1",
		Network: &client.Network{Allow: []string{"pypi.test:443", "git.test:443"}}})
	if _, err := env.c.Upload(ctxFor(t, time.Minute), s.ID, "/tmp/test-ca.pem", bytes.NewReader(ca), int64(len(ca)), ""); err != nil {
		t.Fatal(err)
	}
	// The template's bundle and the test CA (the root filesystem is
	// read-only: a user's own CA goes in a bundle of its own).
	if res, out, errOut := run(t, s.ID, client.ExecRequest{Cmd: "grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt && cat /etc/ssl/certs/ca-certificates.crt /tmp/test-ca.pem > /tmp/bundle.pem"}); res.ExitCode != 0 {
		t.Fatalf("the template's CA bundle: %d %s %s", res.ExitCode, out, errOut)
	}
	res, out, errOut := run(t, s.ID, client.ExecRequest{Cmd: "pip install --index-url https://pypi.test/simple/ fbhello",
		Env: map[string]string{"PIP_CERT": "/tmp/bundle.pem"}, TimeoutS: 120})
	if res.ExitCode != 0 || !strings.Contains(out, "Successfully installed fbhello-0.1") {
		t.Fatalf("pip install over HTTPS: exit %d\n%s\n%s", res.ExitCode, out, errOut)
	}
	if ex := runCode(t, s.ID, client.CodeRequest{Code: "import fbhello\nfbhello.greet()"}); ex.Text != "hello from the index" {
		t.Errorf("the kernel imports the package: %+v", ex)
	}
	cc, err := env.c.CreateCodeContext(ctxFor(t, time.Minute), s.ID, client.CodeContextRequest{Language: "bash"})
	if err != nil {
		t.Fatal(err)
	}
	ex := runCode(t, s.ID, client.CodeRequest{ContextID: cc.ID, Code: "cd /tmp && git clone -q https://git.test/repo.git && cat repo/README",
		EnvVars: map[string]string{"GIT_SSL_CAINFO": "/tmp/bundle.pem"}})
	if ex.Error != nil || ex.Stdout != "cloned over https\n" {
		t.Errorf("git clone over HTTPS: %+v (stderr %q)", ex, ex.Stderr)
	}
	// Off the list: refused (the proxy answers 403, or the name does not
	// resolve).
	if res, _, _ := run(t, s.ID, client.ExecRequest{Cmd: "pip download --retries 0 --timeout 10 --no-deps -d /tmp/x --index-url https://pypi.org/simple/ requests", TimeoutS: 60}); res.ExitCode == 0 {
		t.Error("pip reached pypi.org, which the allow-list does not name")
	}
}

// testWheel returns a pure-Python wheel of package fbhello 0.1, whose
// greet() returns "hello from the index".
func testWheel(t *testing.T) []byte {
	t.Helper()
	files := []struct{ name, body string }{
		{"fbhello/__init__.py", "def greet():\n    return 'hello from the index'\n"},
		{"fbhello-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: fbhello\nVersion: 0.1\n"},
		{"fbhello-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: forkbox-e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(f.body))
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString("fbhello-0.1.dist-info/RECORD,,\n")
	w, err := zw.Create("fbhello-0.1.dist-info/RECORD")
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte(record.String()))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// testGitRepo makes a bare git repository with one commit (a README) that
// git's "dumb" HTTP protocol can clone from its files, and returns its
// directory.
func testGitRepo(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	work, bare := filepath.Join(dir, "work"), filepath.Join(dir, "repo.git")
	git := func(wd string, args ...string) {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = wd
		cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@test", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@test", "GIT_CONFIG_GLOBAL=/dev/null")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "README"), []byte("cloned over https\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	git(work, "init", "-q", "-b", "main")
	git(work, "add", "README")
	git(work, "commit", "-q", "-m", "first")
	git(dir, "clone", "-q", "--bare", work, bare)
	git(bare, "update-server-info")
	return bare
}
