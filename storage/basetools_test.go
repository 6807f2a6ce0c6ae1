package storage

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestBaseCACertificates: the base template's /etc/ssl/certs has the
// host's bundle byte for byte, hash links that resolve inside it, and
// nothing of /etc/ssl/private.
func TestBaseCACertificates(t *testing.T) {
	host, err := os.ReadFile(filepath.Join(hostCerts, "ca-certificates.crt"))
	if err != nil {
		if os.Getenv("CI") == "1" {
			t.Fatalf("the host has no CA bundle (install ca-certificates): %v", err)
		}
		t.Skipf("the host has no CA bundle (install ca-certificates): %v", err)
	}
	if os.Geteuid() != 0 {
		t.Skip("building the base template chowns its files: needs root")
	}
	dir := filepath.Join(t.TempDir(), "base")
	if _, err := BuildBase(dir, DefaultIDShift); err != nil {
		t.Fatal(err)
	}
	certs := filepath.Join(RootFS(dir), "etc/ssl/certs")
	got, err := os.ReadFile(filepath.Join(certs, "ca-certificates.crt"))
	if err != nil || !bytes.Equal(got, host) {
		t.Fatalf("bundle in the template: %d bytes, %v; want the host's %d", len(got), err, len(host))
	}
	entries, err := os.ReadDir(certs)
	if err != nil {
		t.Fatal(err)
	}
	hashLinks := 0
	for _, e := range entries {
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		target, _ := os.Readlink(filepath.Join(certs, e.Name()))
		if !strings.Contains(target, "/") {
			hashLinks++
			if _, err := os.Lstat(filepath.Join(certs, target)); err != nil {
				t.Errorf("hash link %s -> %s dangles in the template", e.Name(), target)
			}
		} else if !underSystemDir(target) {
			t.Errorf("link %s -> %s points outside the system directories", e.Name(), target)
		}
	}
	if hashLinks == 0 {
		t.Error("no OpenSSL hash links in the template's /etc/ssl/certs")
	}
	if _, err := os.Lstat(filepath.Join(RootFS(dir), "etc/ssl/private")); err == nil {
		t.Error("the template has /etc/ssl/private")
	}
}

// TestBaseVenv runs the host's python through the template's default
// virtual environment: it is a venv (prefix differs from the base), sees
// the system packages (pip), and pip does not refuse to install into it
// (PEP 668's refusal names "externally-managed-environment").
func TestBaseVenv(t *testing.T) {
	if _, err := os.Readlink("/usr/bin/python3"); err != nil {
		t.Skip("the host has no /usr/bin/python3 link: the template gets no venv")
	}
	if os.Geteuid() != 0 {
		t.Skip("building the base template chowns its files: needs root")
	}
	dir := filepath.Join(t.TempDir(), "base")
	tpl, err := BuildBase(dir, DefaultIDShift)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tpl.Env[1], "PATH="+VenvDir+"/bin:") {
		t.Fatalf("template env %q: the venv is not first on PATH", tpl.Env)
	}
	venv := filepath.Join(RootFS(dir), VenvDir)
	if _, err := os.Stat(venv); err != nil {
		t.Fatal(err)
	}
	py := filepath.Join(venv, "bin/python3")
	out, err := exec.Command(py, "-c", "import sys, pip; print(sys.prefix != sys.base_prefix, sys.prefix)").CombinedOutput()
	if err != nil {
		t.Fatalf("venv python: %v: %s", err, out)
	}
	if !strings.HasPrefix(string(out), "True "+venv) {
		t.Fatalf("venv python says %q; want a venv at %s", out, venv)
	}
	pip := exec.Command(py, filepath.Join(venv, "bin/pip"), "install", "--no-index", "--dry-run", "forkbox-no-such-package")
	out, _ = pip.CombinedOutput()
	if strings.Contains(string(out), "externally-managed") || !strings.Contains(string(out), "forkbox-no-such-package") {
		t.Fatalf("pip in the venv: %s", out)
	}
}
