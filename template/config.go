package template

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/image"
)

// ImportOptions are how Catalog.Import takes an image.
type ImportOptions struct {
	// Ref picks one image when the source holds several ("" for the
	// only one).
	Ref string
	// Source is what the template's Source shows: what the user named
	// (the uploaded file's name, an image reference); "" for "upload".
	Source string
	// Shared makes the template every tenant's (admin keys only).
	Shared bool
	// StartCmd makes the image's ENTRYPOINT and CMD the template's start
	// command (storage.Template.StartCmd).
	StartCmd bool
	// MaxBytes caps the bytes of the image's files (0: only the host's
	// cap); past it the import fails with the 413 template-too-large,
	// whose message names the limit as MaxBytesName says ("tenant a's
	// max_template_mb"; "" for "the limit").
	MaxBytes     int64
	MaxBytesName string
}

// source is the Source a template imported with o records.
func (o ImportOptions) source() string {
	if o.Source == "" {
		return "upload"
	}
	return o.Source
}

// maxSourceLen bounds ImportOptions.Source, in bytes.
const maxSourceLen = 200

// CheckSource reports whether s can be an ImportOptions.Source, a label
// the caller chose (the CLI sends the file's base name): at most 200
// bytes of printable UTF-8. ErrInvalidArgument naming the field "source"
// otherwise.
func CheckSource(s string) error {
	if len(s) > maxSourceLen {
		return errdefs.InvalidField("source", "longer than %d bytes", maxSourceLen)
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || r == 0xfffd {
			return errdefs.InvalidField("source", "must be printable text")
		}
	}
	return nil
}

// applyConfig sets t's User, Cmd and StartCmd from the image's config:
// USER's user part (a group after ":" is left to the account's own),
// which must be a numeric uid below idSize or a name the image's
// /etc/passwd (in rootfs) has, or "root"/"user" (which every sandbox
// has); the ENTRYPOINT and CMD; and those as the start command when
// o.StartCmd. Errors are ErrInvalidArgument naming the field ("user",
// "start_cmd").
func applyConfig(t *storage.Template, img *image.Image, rootfs string, o ImportOptions, idSize uint32) error {
	if u, _, _ := strings.Cut(img.User, ":"); u != "" {
		if err := checkImageUser(u, rootfs, idSize); err != nil {
			return err
		}
		t.User = u
	}
	t.Cmd = append(append([]string(nil), img.Entrypoint...), img.Cmd...)
	if len(t.Cmd) == 0 {
		t.Cmd = nil
	}
	if o.StartCmd {
		if len(t.Cmd) == 0 {
			return errdefs.InvalidField("start_cmd", "the image has no CMD or ENTRYPOINT to start")
		}
		t.StartCmd = t.Cmd
	}
	return nil
}

// checkImageUser checks that the image's USER u names an account
// sessions can run as (see applyConfig).
func checkImageUser(u, rootfs string, idSize uint32) error {
	if n, err := strconv.ParseUint(u, 10, 32); err == nil {
		if n >= uint64(idSize) {
			return errdefs.InvalidField("user", "the image's USER %s is outside the sandbox's ids (0-%d)", u, idSize-1)
		}
		return nil
	}
	if len(u) > 32 || strings.Trim(u, "abcdefghijklmnopqrstuvwxyz0123456789_.-") != "" || u[0] == '-' {
		return errdefs.InvalidField("user", "the image's USER %q is not a user name forkbox runs as ([a-z0-9_.-], or a uid)", u)
	}
	if u == "root" || u == "user" {
		return nil
	}
	ok, err := passwdHas(rootfs, u)
	if err != nil {
		return err
	}
	if !ok {
		return errdefs.InvalidField("user", "the image's USER %q has no entry in the image's /etc/passwd: "+
			"add the user to the image (useradd) or give USER a uid", u)
	}
	return nil
}

// passwdHas reports whether the /etc/passwd of the image in rootfs has an
// entry named name. A passwd that is missing, or not a regular file (a
// link could lead out of the image), has no entries.
func passwdHas(rootfs, name string) (bool, error) {
	p := filepath.Join(rootfs, "etc", "passwd")
	for _, dir := range []string{filepath.Join(rootfs, "etc"), p} {
		fi, err := os.Lstat(dir)
		if err != nil || fi.Mode()&os.ModeSymlink != 0 {
			return false, nil
		}
	}
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false, nil
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return false, nil
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	for sc.Scan() {
		if n, _, ok := strings.Cut(sc.Text(), ":"); ok && n == name {
			return true, nil
		}
	}
	if err := sc.Err(); err != nil {
		return false, fmt.Errorf("read the image's /etc/passwd: %w", errdefs.ErrInvalidArgument)
	}
	return false, nil
}
