package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkbox/forkbox/bindmount"
)

// hostSystemDirs are the host directories the base template mounts
// read-only, when they exist. A directory that is a symlink on the host
// (/bin -> usr/bin on merged-/usr systems) becomes the same symlink in the
// template instead of a mount.
var hostSystemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"}

// basePasswd, baseGroup and friends are the synthesized /etc of the base
// template. The host's /etc is never used: no shadow file, keys or host
// configuration can leak into a sandbox.
const (
	basePasswd = `root:x:0:0:root:/root:/bin/bash
user:x:1000:1000:user:/home/user:/bin/bash
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin
`
	baseGroup = `root:x:0:
tty:x:5:
users:x:100:user
user:x:1000:
nogroup:x:65534:
`
	baseHosts = `127.0.0.1	localhost
::1	localhost ip6-localhost ip6-loopback
`
	baseResolv = `# forkbox: this sandbox has no network unless its policy allows egress.
`
	baseNsswitch = `passwd:         files
group:          files
shadow:         files
hosts:          files dns
networks:       files
protocols:      files
services:       files
`
	baseProfile = `# forkbox base template
if [ -z "$PATH" ]; then
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
fi
case ":$PATH:" in
  *:/home/user/.venv/bin:*) ;;
  *) [ -d /home/user/.venv/bin ] && PATH=/home/user/.venv/bin:$PATH && VIRTUAL_ENV=/home/user/.venv && export VIRTUAL_ENV ;;
esac
export PATH
if [ "$(id -u)" -eq 0 ]; then PS1='# '; else PS1='$ '; fi
`
)

// BuildBase writes the built-in "base" template into dir (which must not
// exist): a rootfs holding mount points for the host's system directories
// and a synthesized /etc (passwd, group, hosts, resolv.conf, nsswitch.conf,
// profile, ld.so.cache, the host's CA certificates and the
// /etc/alternatives symlinks that point into the mounted system
// directories), and the default Python virtual environment (VenvDir, the
// user's, first on PATH: BaseEnv). Files are owned by the shifted root.
func BuildBase(dir string, shift IDShift) (*Template, error) {
	rootfs := RootFS(dir)
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		return nil, err
	}
	root := shift.UID(RootUID)
	if err := os.Lchown(rootfs, root, shift.GID(RootUID)); err != nil {
		return nil, err
	}
	t := &Template{
		Name: BaseTemplate, Source: "builtin", Version: baseTemplateVersion,
		Env:       append([]string(nil), BaseEnv...),
		CreatedAt: time.Now().UTC().Format(time.RFC3339),
	}
	for _, d := range hostSystemDirs {
		fi, err := os.Lstat(d)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		target := filepath.Join(rootfs, d)
		if fi.Mode()&os.ModeSymlink != 0 {
			link, err := os.Readlink(d)
			if err != nil {
				return nil, err
			}
			if err := os.Symlink(link, target); err != nil {
				return nil, err
			}
			if err := os.Lchown(target, root, shift.GID(RootUID)); err != nil {
				return nil, err
			}
			continue
		}
		if !fi.IsDir() {
			continue
		}
		if err := mkdirOwned(target, 0o755, root, shift.GID(RootUID)); err != nil {
			return nil, err
		}
		t.HostMounts = append(t.HostMounts, bindmount.Mount{Source: d, Target: d, ReadOnly: true})
	}
	if err := writeBaseEtc(filepath.Join(rootfs, "etc"), shift); err != nil {
		return nil, fmt.Errorf("synthesize /etc: %w", err)
	}
	if err := PrepareUserDirs(rootfs, shift); err != nil {
		return nil, err
	}
	if err := writeVenv(rootfs, shift); err != nil {
		return nil, fmt.Errorf("default virtual environment: %w", err)
	}
	for _, d := range []string{"proc", "sys", "dev", "run", "var", "var/tmp", "mnt", "opt", "srv"} {
		if err := mkdirOwned(filepath.Join(rootfs, d), 0o755, root, shift.GID(RootUID)); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(filepath.Join(rootfs, "var/tmp"), os.ModeSticky|0o777); err != nil {
		return nil, err
	}
	if err := SaveTemplate(dir, t); err != nil {
		return nil, err
	}
	return t, nil
}

// BaseIsCurrent reports whether dir holds a base template built by this
// version of forkbox.
func BaseIsCurrent(dir string) bool {
	t, err := LoadTemplate(dir)
	return err == nil && t.Version == baseTemplateVersion
}

func writeBaseEtc(etc string, shift IDShift) error {
	root, rootG := shift.UID(RootUID), shift.GID(RootUID)
	if err := mkdirOwned(etc, 0o755, root, rootG); err != nil {
		return err
	}
	files := map[string]string{
		"passwd": basePasswd, "group": baseGroup, "hosts": baseHosts, "hostname": "sandbox\n",
		"resolv.conf": baseResolv, "nsswitch.conf": baseNsswitch, "profile": baseProfile,
		"shells": "/bin/sh\n/bin/bash\n/usr/bin/bash\n",
	}
	for name, content := range files {
		p := filepath.Join(etc, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
		if err := os.Lchown(p, root, rootG); err != nil {
			return err
		}
	}
	// ld.so.cache indexes the libraries under the mounted /usr; it holds no
	// secrets and spares every process a search of the library path.
	if b, err := os.ReadFile("/etc/ld.so.cache"); err == nil {
		p := filepath.Join(etc, "ld.so.cache")
		if err := os.WriteFile(p, b, 0o644); err != nil {
			return err
		}
		if err := os.Lchown(p, root, rootG); err != nil {
			return err
		}
	}
	for name, target := range map[string]string{
		"os-release": "../usr/lib/os-release",
		"localtime":  "/usr/share/zoneinfo/Etc/UTC",
	} {
		p := filepath.Join(etc, name)
		if err := os.Symlink(target, p); err != nil {
			return err
		}
		_ = os.Lchown(p, root, rootG)
	}
	if err := writeCACerts(etc, root, rootG); err != nil {
		return fmt.Errorf("CA certificates: %w", err)
	}
	for _, name := range hostConfigFiles {
		if _, err := os.Stat(filepath.Join("/etc", name)); err == nil {
			if err := copySmallFile(filepath.Join("/etc", name), filepath.Join(etc, name), root, rootG); err != nil {
				return fmt.Errorf("/etc/%s: %w", name, err)
			}
		}
	}
	return copyAlternatives("/etc/alternatives", filepath.Join(etc, "alternatives"), root, rootG)
}

// copyAlternatives recreates the Debian alternatives symlinks (awk, editor,
// which, ...) whose targets lie in the mounted system directories.
func copyAlternatives(src, dst string, uid, gid int) error {
	if err := mkdirOwned(dst, 0o755, uid, gid); err != nil {
		return err
	}
	entries, err := os.ReadDir(src)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.Type()&os.ModeSymlink == 0 {
			continue
		}
		target, err := os.Readlink(filepath.Join(src, e.Name()))
		if err != nil || !underSystemDir(target) {
			continue
		}
		p := filepath.Join(dst, e.Name())
		if err := os.Symlink(target, p); err != nil {
			return err
		}
		_ = os.Lchown(p, uid, gid)
	}
	return nil
}

func underSystemDir(p string) bool {
	for _, d := range hostSystemDirs {
		if strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

func mkdirOwned(p string, mode os.FileMode, uid, gid int) error {
	if err := os.Mkdir(p, mode); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	if err := os.Chmod(p, mode); err != nil {
		return err
	}
	return os.Lchown(p, uid, gid)
}
