package storage

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// VenvDir is the base template's default Python virtual environment: on
// PATH first, seeing the host's system packages (numpy, pandas, ...), and
// in the user's home, so the sandbox's user can `pip install` into it
// without flags (Debian's python refuses installs outside a virtual
// environment: PEP 668).
const VenvDir = "/home/user/.venv"

// BaseEnv is the environment of every process of a base-template sandbox.
var BaseEnv = []string{
	"LANG=C.UTF-8",
	"PATH=" + VenvDir + "/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"VIRTUAL_ENV=" + VenvDir,
}

// maxCertFile bounds a certificate file copied from the host, in bytes.
const maxCertFile = 8 << 20

// hostConfigFiles are the host's files in /etc that programs of the
// mounted /usr read and the base template copies when the host has them:
// Debian's python3-matplotlib keeps its defaults in /etc/matplotlibrc
// (without it, importing matplotlib fails).
var hostConfigFiles = []string{"matplotlibrc"}

// hostCerts is the host's certificate directory the base template copies.
const hostCerts = "/etc/ssl/certs"

// writeCACerts gives the template's /etc the host's CA certificates, so
// TLS clients in a sandbox (pip, git, curl, Python's ssl) verify servers
// as the host does: /etc/ssl/certs with the bundle (ca-certificates.crt)
// and the other certificate files, the symlinks into the mounted /usr and
// the hash links OpenSSL looks certificates up by, and /etc/ssl/openssl.cnf.
// Only public certificates are copied: never /etc/ssl/private. The egress
// proxy forwards TLS by SNI without terminating it, so the sandbox needs
// to trust nothing else. A host without the directory gets none.
func writeCACerts(etc string, uid, gid int) error {
	entries, err := os.ReadDir(hostCerts)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	ssl := filepath.Join(etc, "ssl")
	certs := filepath.Join(ssl, "certs")
	for _, d := range []string{ssl, certs} {
		if err := mkdirOwned(d, 0o755, uid, gid); err != nil {
			return err
		}
	}
	names := map[string]bool{}
	for _, e := range entries {
		names[e.Name()] = true
	}
	for _, e := range entries {
		src, dst := filepath.Join(hostCerts, e.Name()), filepath.Join(certs, e.Name())
		switch {
		case e.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(src)
			if err != nil {
				continue
			}
			// A link into the mounted system directories, or to another
			// entry of this directory (OpenSSL's hash links).
			if !underSystemDir(target) && !(names[target] && !strings.Contains(target, "/")) {
				continue
			}
			if err := os.Symlink(target, dst); err != nil {
				return err
			}
			_ = os.Lchown(dst, uid, gid)
		case e.Type().IsRegular() && isCertName(e.Name()):
			if err := copySmallFile(src, dst, uid, gid); err != nil {
				return err
			}
		}
	}
	if _, err := os.Stat("/etc/ssl/openssl.cnf"); err == nil {
		return copySmallFile("/etc/ssl/openssl.cnf", filepath.Join(ssl, "openssl.cnf"), uid, gid)
	}
	return nil
}

// isCertName reports whether a file name is one of a certificate (or a
// bundle of them).
func isCertName(name string) bool {
	return strings.HasSuffix(name, ".pem") || strings.HasSuffix(name, ".crt")
}

// copySmallFile copies regular file src (at most maxCertFile bytes) to
// dst, mode 0644, owned by uid:gid.
func copySmallFile(src, dst string, uid, gid int) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxCertFile+1))
	if err != nil {
		return err
	}
	if len(b) > maxCertFile {
		return nil // not a certificate file
	}
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		return err
	}
	return os.Lchown(dst, uid, gid)
}

// pythonName matches the name /usr/bin/python3 links to ("python3.11").
var pythonName = regexp.MustCompile(`^python3\.[0-9]+$`)

// writeVenv makes the default virtual environment (VenvDir) in rootfs, as
// `python3 -m venv --system-site-packages --without-pip` lays it out,
// written directly so that no host path ends up in it: pyvenv.cfg (home
// /usr/bin, system site packages on), bin/python3 and bin/python linking
// to the host's interpreter in the mounted /usr, an empty site-packages,
// and bin/pip and bin/pip3 running the system pip with the venv's python
// (which then installs into the venv). All of it belongs to the sandbox's
// user. A host without python3 gets no venv.
func writeVenv(rootfs string, shift IDShift) error {
	target, err := os.Readlink("/usr/bin/python3")
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil || !pythonName.MatchString(target) {
		return nil // not Debian's layout: no default venv
	}
	uid, gid := shift.UID(UserUID), shift.GID(UserUID)
	venv := filepath.Join(rootfs, VenvDir)
	site := filepath.Join(venv, "lib", target, "site-packages")
	for _, d := range []string{venv, filepath.Join(venv, "bin"), filepath.Join(venv, "include"),
		filepath.Join(venv, "lib"), filepath.Join(venv, "lib", target), site} {
		if err := mkdirOwned(d, 0o755, uid, gid); err != nil {
			return err
		}
	}
	files := map[string]struct {
		content string
		mode    os.FileMode
	}{
		"pyvenv.cfg": {"home = /usr/bin\ninclude-system-site-packages = true\n", 0o644},
		"bin/pip":    {pipLauncher, 0o755},
		"bin/pip3":   {pipLauncher, 0o755},
	}
	for name, f := range files {
		p := filepath.Join(venv, name)
		if err := os.WriteFile(p, []byte(f.content), f.mode); err != nil {
			return err
		}
		if err := os.Lchown(p, uid, gid); err != nil {
			return err
		}
	}
	for name, to := range map[string]string{
		"bin/python3": "/usr/bin/python3", "bin/python": "python3", "bin/" + target: "python3", "lib64": "lib",
	} {
		p := filepath.Join(venv, name)
		if err := os.Symlink(to, p); err != nil {
			return err
		}
		_ = os.Lchown(p, uid, gid)
	}
	return nil
}

// pipLauncher runs the system pip with the venv's interpreter.
const pipLauncher = `#!` + VenvDir + `/bin/python3
import sys
from pip._internal.cli.main import main
sys.exit(main())
`
