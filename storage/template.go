package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/forkbox/forkbox/bindmount"
)

// BaseTemplate is the name of the built-in template.
const BaseTemplate = "base"

// CodeInterpreterTemplate is the template @e2b/code-interpreter's
// Sandbox.create() asks for (POST /v2/sandboxes {"templateID":
// "code-interpreter-v1"}: section 7 of the E2B compatibility notes). It is
// an alias of the base template, which has Python with ipykernel, numpy,
// pandas, matplotlib and scipy when the host has them (the install
// script installs them): a session created from it is a base session.
const CodeInterpreterTemplate = "code-interpreter-v1"

// TemplateAlias returns the template that name is an alias of, and
// whether it is one (CodeInterpreterTemplate is BaseTemplate's).
// Aliases are built in: no import can take their names.
func TemplateAlias(name string) (string, bool) {
	if name == CodeInterpreterTemplate {
		return BaseTemplate, true
	}
	return "", false
}

// baseTemplateVersion is bumped whenever BuildBase changes what it writes,
// so an older base template on disk is rebuilt at start-up.
const baseTemplateVersion = 5

// Template is a template's metadata, stored as template.json beside its rootfs.
type Template struct {
	Name string `json:"name"`
	// Source says where the rootfs came from: "builtin" or "upload"
	// (templates imported before it said "upload" hold the host path of
	// the upload; the API shows those as "upload" too).
	Source string `json:"source"`
	// Digest is the image manifest digest ("sha256:...") of imported templates.
	Digest string `json:"digest,omitempty"`
	// Env is the image's environment (KEY=VALUE), applied to every process.
	Env []string `json:"env,omitempty"`
	// Workdir is the default working directory; "" means the user's home.
	Workdir string `json:"workdir,omitempty"`
	// User is the image's USER (its user part: a name in the image's
	// /etc/passwd or a numeric uid): sessions that name no user run as
	// it. "" means the sandbox default, "user".
	User string `json:"user,omitempty"`
	// Cmd is the image's ENTRYPOINT followed by its CMD (argv; nil when
	// the image has neither), as the import found it.
	Cmd []string `json:"cmd,omitempty"`
	// StartCmd, when set (the import was asked to keep Cmd as the start
	// command), is started in the background in every session made from
	// the template (not from a snapshot of one), as the session's user in
	// its working directory, tagged "start".
	StartCmd []string `json:"start_cmd,omitempty"`
	// ReadyCmd, when set, is the template's ready check (argv): a create
	// of a session from the template (not from a snapshot of one)
	// returns only once it exits 0 in the sandbox, run after StartCmd
	// was started, as the session's user, again every 50 ms (a
	// Dockerfile's HEALTHCHECK CMD, the build's ready_cmd, E2B's
	// readyCmd).
	ReadyCmd []string `json:"ready_cmd,omitempty"`
	// ReadyTimeoutS bounds the wait for ReadyCmd, in seconds (0: the
	// daemon's default, sandbox.DefaultReadyTimeoutS).
	ReadyTimeoutS int64 `json:"ready_timeout_s,omitempty"`
	// WarmSnapshot, when set, is a memory snapshot (gVisor) of a session
	// of this template taken once its start command ran and its ready
	// check passed: a create that asks for nothing the snapshot cannot
	// give restores it, so the server is running at once
	// (sandbox/warm.go). The snapshot belongs to the template's tenant.
	WarmSnapshot string `json:"warm_snapshot,omitempty"`
	// Layers is how many image layers the import applied (a built
	// template's: how many steps its Dockerfile has).
	Layers int `json:"layers,omitempty"`
	// Tier is the isolation tier ("runc", "gvisor") a built template's
	// steps ran in, which its files were made by; empty for a template
	// that was imported, pulled or is built in.
	Tier string `json:"tier,omitempty"`
	// LayerDigests are the digests ("sha256:...") of the compressed
	// layers of a template pulled from a registry, lowest first: the
	// layer cache (storage/layercache) keeps them while the template
	// exists. Empty for other templates.
	LayerDigests []string `json:"layer_digests,omitempty"`
	// HostMounts are host directories bind-mounted read-only into every
	// sandbox of this template (the base template's /usr and friends).
	HostMounts []bindmount.Mount `json:"host_mounts,omitempty"`
	// SizeBytes is the size of the rootfs in bytes, as written.
	SizeBytes int64 `json:"size_bytes"`
	// Storage, when set, names the storage driver that holds the only
	// copy of the root filesystem (an imported template on btrfs is
	// written into the driver's volume and kept there as a subvolume);
	// then the template's directory has no rootfs/. Empty: rootfs/ is
	// the root filesystem, which the storage driver copies or uses in
	// place.
	Storage string `json:"storage,omitempty"`
	// AliasOf, in a listing only (never stored), names the template this
	// one is a built-in alias of (TemplateAlias).
	AliasOf string `json:"-"`
	// Version is the base template format version (base only).
	Version int `json:"version,omitempty"`
	// CreatedAt is RFC 3339.
	CreatedAt string `json:"created_at"`
}

// DefaultReadyTimeoutS is how long a create waits for a template's
// ready check when the template names no timeout, in seconds: below the
// E2B SDK's 60 s request timeout, so that a create through it gets the
// ready check's error rather than its own timeout.
const DefaultReadyTimeoutS = 30

// MaxReadyTimeoutS bounds a template's ready timeout, in seconds.
const MaxReadyTimeoutS = 600

// MaxReadyCmdBytes bounds a ready check's command line, in bytes.
const MaxReadyCmdBytes = 4096

// RootFS returns the template's root filesystem directory under dir.
func RootFS(templateDir string) string { return filepath.Join(templateDir, "rootfs") }

// LoadTemplate reads template.json from dir. ErrNotFound when absent.
func LoadTemplate(dir string) (*Template, error) {
	var t Template
	if err := ReadJSON(filepath.Join(dir, "template.json"), &t, fmt.Sprintf("template %q", filepath.Base(dir))); err != nil {
		return nil, err
	}
	return &t, nil
}

// SaveTemplate writes t as dir/template.json atomically.
func SaveTemplate(dir string, t *Template) error {
	return WriteJSON(filepath.Join(dir, "template.json"), t, 0o644)
}

// ValidTemplateName reports whether name is usable as a template name:
// 1-63 characters of [a-z0-9._-], starting with a letter or digit, and a
// storage id (ValidID: not ending in ".json"), so both drivers take it.
func ValidTemplateName(name string) bool {
	if name == "" || len(name) > 63 || strings.ContainsAny(name[:1], ".-_") {
		return false
	}
	return strings.Trim(name, "abcdefghijklmnopqrstuvwxyz0123456789._-") == "" && ValidID("template", name) == nil
}

// PrepareUserDirs creates the directories every sandbox needs in rootfs with
// sandbox ownership mapped through shift: /home/user (uid 1000, 0755), /root
// (uid 0, 0700), /tmp (1777), and /.forkbox/bin as the agent's mount point.
// Existing directories keep their contents but get these owners and modes.
func PrepareUserDirs(rootfs string, shift IDShift) error {
	dirs := []struct {
		path string
		uid  uint32
		mode os.FileMode
	}{
		{"home", RootUID, 0o755},
		{"home/user", UserUID, 0o755},
		{"root", RootUID, 0o700},
		{"tmp", RootUID, os.ModeSticky | 0o777},
		{".forkbox", RootUID, 0o755},
		{".forkbox/bin", RootUID, 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(rootfs, d.path)
		if fi, err := os.Lstat(p); err == nil && !fi.IsDir() {
			// A symlink or file here would redirect our mounts; replace it.
			if err := os.Remove(p); err != nil {
				return err
			}
		}
		if err := os.Mkdir(p, d.mode); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
		if err := os.Lchown(p, shift.UID(d.uid), shift.GID(d.uid)); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}
	agent := filepath.Join(rootfs, ".forkbox/bin/forkbox-agent")
	if err := os.WriteFile(agent, nil, 0o755); err != nil {
		return err
	}
	return os.Lchown(agent, shift.UID(RootUID), shift.GID(RootUID))
}

// MountTargets are the files of a template's rootfs that every sandbox
// gets its own copy of, bind-mounted over them (its hostname, hosts entry,
// machine id, and with a network its resolver): see sandbox.start.
var MountTargets = []string{"etc/hosts", "etc/hostname", "etc/machine-id", "etc/resolv.conf"}

// PrepareMountTargets makes rootfs safe to mount MountTargets over: etc
// is a real directory and each target a regular file. An image is
// attacker-controlled, and a target that is a symlink (into /proc, say:
// the runtime refuses to mount there), a directory or a special file
// would make every create of the template fail; such an entry is removed
// (a directory with all it holds) and replaced by an empty file, 0644,
// owned by the sandbox's root through shift, and a missing one is made
// the same way. Regular files keep their content (an image's own
// resolv.conf stays for sandboxes without a network, where nothing is
// mounted over it). Nothing is followed: entries are examined with Lstat
// and created with O_EXCL|O_NOFOLLOW.
func PrepareMountTargets(rootfs string, shift IDShift) error {
	uid, gid := shift.UID(RootUID), shift.GID(RootUID)
	etc := filepath.Join(rootfs, "etc")
	if fi, err := os.Lstat(etc); err == nil && !fi.IsDir() {
		if err := os.Remove(etc); err != nil {
			return err
		}
	}
	if err := os.Mkdir(etc, 0o755); err == nil {
		if err := os.Lchown(etc, uid, gid); err != nil {
			return err
		}
	} else if !errors.Is(err, os.ErrExist) {
		return err
	}
	for _, rel := range MountTargets {
		p := filepath.Join(rootfs, rel)
		fi, err := os.Lstat(p)
		switch {
		case err == nil && fi.Mode().IsRegular():
			continue
		case err == nil:
			if err := RemoveTree(p); err != nil {
				return err
			}
		case !errors.Is(err, os.ErrNotExist):
			return err
		}
		f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o644)
		if err != nil {
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		if err := os.Lchown(p, uid, gid); err != nil {
			return err
		}
	}
	return nil
}
