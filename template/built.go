package template

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"

	"github.com/forkbox/forkbox/bindmount"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/image"
)

// Built is what a Dockerfile build (package build) says of the template
// it made, beside its files.
type Built struct {
	// Source is what the template's Source shows ("build").
	Source string
	// Digest identifies the build's result ("sha256:..." of its last
	// step's cache key).
	Digest string
	// Env (KEY=VALUE), Workdir and User are the Dockerfile's ENV,
	// WORKDIR and USER as they stand after its last step.
	Env     []string
	Workdir string
	User    string
	// Cmd is ENTRYPOINT followed by CMD (nil for neither); with StartCmd
	// it becomes the template's start command.
	Cmd      []string
	StartCmd bool
	// ReadyCmd is the template's ready check (argv; nil: none) and
	// ReadyTimeoutS its wait in seconds (0: the default).
	ReadyCmd      []string
	ReadyTimeoutS int64
	// Steps is how many steps the Dockerfile has (shown as Layers).
	Steps int
	// Tier is the isolation tier the steps ran in (the template's Tier).
	Tier string
	// HostMounts are the parent template's host mounts (a build FROM
	// base keeps base's read-only /usr and friends).
	HostMounts []bindmount.Mount
}

// Reserve takes template name for a build under way until release is
// called (once): ErrInvalidArgument for a bad or reserved name,
// ErrConflict when a template has it or an import, pull or build of it
// is under way (the 409 of two builds of one name at once).
func (c *Catalog) Reserve(name string) (release func(), err error) { return c.reserve(name) }

// InstallBuilt makes template name, owned by tenant ("" shared), from
// the files of from (a snapshot a build's last step took, or the
// template the build started from when no step changed a file) with
// b's configuration: the storage driver prepares a scratch layer on
// from, its tree is copied into the new template's root filesystem
// (storage.CopyTree: owners, modes and links kept; on btrfs the copy
// shares the file data) and the layer is removed; then the template is
// installed as an import is (USER checked against the image's
// /etc/passwd, mount targets made safe; renamed into place and recorded
// at once). The caller holds name (Reserve). On any error nothing of
// the template is left. maxBytes > 0 caps the files' bytes (the 413
// template-too-large naming maxName).
func (c *Catalog) InstallBuilt(ctx context.Context, name, tenant string, from storage.Source, b Built, maxBytes int64, maxName string) (*storage.Template, error) {
	o := ImportOptions{Source: b.Source, StartCmd: b.StartCmd, MaxBytes: maxBytes, MaxBytesName: maxName}
	unpack := func(rootfs string, _ image.IDShift) (*image.Image, error) {
		rnd := make([]byte, 6)
		_, _ = rand.Read(rnd)
		layer := "build-export-" + hex.EncodeToString(rnd)
		src, err := c.storage.Prepare(ctx, layer, from, 0)
		if err != nil {
			return nil, fmt.Errorf("open the build's result: %w", err)
		}
		defer func() { _ = c.storage.Remove(context.WithoutCancel(ctx), layer) }()
		if err := os.Mkdir(rootfs, 0o755); err != nil {
			return nil, err
		}
		size, err := storage.CopyTree(ctx, src, rootfs)
		if err != nil {
			return nil, fmt.Errorf("copy the build's result: %w", err)
		}
		if maxBytes > 0 && size > maxBytes {
			return nil, tooLarge(fmt.Errorf("the build's files are %d bytes: %w", size, image.ErrTooLarge), maxBytes, maxName)
		}
		return &image.Image{Digest: b.Digest, Env: b.Env, WorkingDir: b.Workdir, User: b.User,
			Cmd: b.Cmd, SizeBytes: size, Layers: b.Steps}, nil
	}
	edit := func(t *storage.Template) {
		t.HostMounts = append([]bindmount.Mount(nil), b.HostMounts...)
		t.Tier = b.Tier
		t.ReadyCmd, t.ReadyTimeoutS = append([]string(nil), b.ReadyCmd...), b.ReadyTimeoutS
		if len(t.ReadyCmd) == 0 {
			t.ReadyCmd = nil
		}
	}
	return c.install(ctx, name, tenant, o, unpack, edit)
}

// BuildCacheDir is the directory the Dockerfile builder keeps its step
// cache in (DATA/build-cache).
func (c *Catalog) BuildCacheDir() string { return c.layout.BuildCache() }
