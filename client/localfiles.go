package client

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"github.com/forkbox/forkbox/internal/tartree"
)

// UploadFile uploads the local regular file at local to path p (see Upload)
// in session id, owned by user ("" for the session's user), and returns
// the entry written. Its size is sent up front. A directory is refused
// before anything is sent ("... is a directory"); the errors of opening
// local are returned as they are.
func (c *Client) UploadFile(ctx context.Context, id, p, local, user string) (*Entry, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	f, err := os.Open(local)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.IsDir() {
		return nil, fmt.Errorf("%s is a directory; copy files one by one or pack a tar", local)
	}
	return c.Upload(ctx, id, p, f, fi.Size(), user)
}

// DownloadFile copies the file at path p (see Download) in session id, read as
// user ("" for the session's user), to the local path local. It writes a
// temporary file beside local and renames it over local once the whole
// file arrived, so local is never left half-written and a failed
// download leaves nothing behind.
func (c *Client) DownloadFile(ctx context.Context, id, p, local, user string) error {
	rc, err := c.Download(ctx, id, p, user)
	if err != nil {
		return err
	}
	defer rc.Close()
	tmp, err := os.CreateTemp(filepath.Dir(local), "."+filepath.Base(local)+".part-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := io.Copy(tmp, rc); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), local)
}

// ImportTemplatePath imports the OCI image at the local path as template
// name (see ImportTemplate; ref picks one of several images): an OCI
// layout directory is packed as a tar while it is sent, a file (a docker
// save or OCI tarball) is sent as it is, with its size.
func (c *Client) ImportTemplatePath(ctx context.Context, name, ref, path string) (*Template, error) {
	return c.ImportTemplatePathWith(ctx, name, path, ImportOptions{Ref: ref})
}

// ImportTemplatePathWith is ImportTemplatePath with options; o.Source ""
// sends the path's base name (the file's or directory's name, not where
// it is).
func (c *Client) ImportTemplatePathWith(ctx context.Context, name, path string, o ImportOptions) (*Template, error) {
	if err := checkID("template", name); err != nil {
		return nil, err
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if o.Source == "" {
		o.Source = sourceLabel(path)
	}
	if fi.IsDir() {
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(tartree.Write(pw, path)) }()
		defer pr.Close() // ends the packing when the upload stops early
		return c.ImportTemplateWith(ctx, name, pr, -1, o)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return c.ImportTemplateWith(ctx, name, f, fi.Size(), o)
}

// sourceLabel is the template source a local path shows as: its base
// name, cut to 200 bytes, control characters dropped ("" when nothing is
// left).
func sourceLabel(path string) string {
	base := filepath.Base(filepath.Clean(path))
	if base == "." || base == "/" {
		return ""
	}
	base = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f || r == utf8.RuneError {
			return -1
		}
		return r
	}, base)
	for len(base) > 200 {
		_, n := utf8.DecodeLastRuneInString(base)
		base = base[:len(base)-n]
	}
	return base
}
