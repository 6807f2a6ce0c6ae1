package client

import (
	"context"
	"fmt"
	v1 "github.com/forkbox/forkbox/api/v1"
	"io"
	"net/http"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
)

// filesPath builds /v1/sessions/ID/files/PATH with each segment escaped.
func filesPath(id, p string) string {
	segs := strings.Split(strings.TrimPrefix(p, "/"), "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return "/v1/sessions/" + url.PathEscape(id) + "/files/" + strings.Join(segs, "/")
}

// relativePath cleans a relative sandbox path p ("a/../b" is "b"), since
// the daemon's routes take no "." or ".." segments; one that climbs out of
// the working directory is an error naming it (give an absolute path).
// Absolute paths are returned as they are (the daemon cleans them).
func relativePath(p string) (string, error) {
	if strings.HasPrefix(p, "/") || p == "" {
		return p, nil
	}
	if !slices.ContainsFunc(strings.Split(p, "/"), func(s string) bool { return s == "." || s == ".." }) {
		return p, nil
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("sandbox path %q climbs out of the session's working directory: give an absolute path", p)
	}
	if strings.HasSuffix(p, "/") && c != "." {
		c += "/" // still names a directory
	}
	return c, nil
}

func userQuery(user string) url.Values {
	if user == "" {
		return nil
	}
	return url.Values{"user": {user}}
}

// fileQuery is the query of a call on the file at p as user: user's name
// when not "", and relative=true when p is relative (the daemon takes it
// from the session's working directory).
func fileQuery(p, user string) url.Values {
	q := userQuery(user)
	if !strings.HasPrefix(p, "/") {
		if q == nil {
			q = url.Values{}
		}
		q.Set("relative", "true")
	}
	return q
}

// Upload streams r into path p in the sandbox, as user ("" = the
// session's default): an absolute path, or one relative to the session's
// working directory (where exec starts commands: the session's workdir,
// else its template's WORKDIR, else the user's home). size is r's length
// in bytes or -1 if unknown.
func (c *Client) Upload(ctx context.Context, id, p string, r io.Reader, size int64, user string) (*Entry, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	p, err := relativePath(p)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, request{method: http.MethodPut, path: filesPath(id, p), query: fileQuery(p, user),
		body: r, size: size, contentType: "application/octet-stream", accept: "application/json"})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	e := &Entry{}
	return e, decodeBody(resp, e)
}

// Download opens the file at path p (absolute, or relative to the
// session's working directory as for Upload); the caller closes it.
func (c *Client) Download(ctx context.Context, id, p, user string) (io.ReadCloser, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	p, err := relativePath(p)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, request{method: http.MethodGet, path: filesPath(id, p), query: fileQuery(p, user)})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// Remove deletes a file or directory tree (p as for Upload).
func (c *Client) Remove(ctx context.Context, id, p, user string) error {
	if err := checkID("session", id); err != nil {
		return err
	}
	p, err := relativePath(p)
	if err != nil {
		return err
	}
	_, err = c.doJSON(ctx, http.MethodDelete, filesPath(id, p), fileQuery(p, user), nil, nil, nil)
	return err
}

// Stat describes path p.
func (c *Client) Stat(ctx context.Context, id, p, user string) (*Entry, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	q := url.Values{"path": {p}}
	if user != "" {
		q.Set("user", user)
	}
	e := &Entry{}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(id)+"/fs/stat", q, nil, nil, e)
	return e, err
}

// ListDir lists directory p down to depth levels (1 = its entries).
func (c *Client) ListDir(ctx context.Context, id, p string, depth int, user string) ([]Entry, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	q := url.Values{"path": {p}, "depth": {strconv.Itoa(depth)}}
	if user != "" {
		q.Set("user", user)
	}
	var out v1.EntryList
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(id)+"/fs/list", q, nil, nil, &out)
	return out.Entries, err
}

// MakeDir creates directory p and its parents.
func (c *Client) MakeDir(ctx context.Context, id, p, user string) (*Entry, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	e := &Entry{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/fs/mkdir", nil, nil,
		v1.PathRequest{Path: p, User: user}, e)
	return e, err
}

// Move renames source to destination.
func (c *Client) Move(ctx context.Context, id, source, destination, user string) (*Entry, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	e := &Entry{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/fs/move", nil, nil,
		v1.MoveRequest{Source: source, Destination: destination, User: user}, e)
	return e, err
}

// Templates lists templates.
func (c *Client) Templates(ctx context.Context) ([]Template, error) {
	var out v1.TemplateList
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/templates", nil, nil, nil, &out)
	return out.Templates, err
}

// ImportTemplate uploads an image tarball (`docker save` output or an OCI
// layout packed as a tar) as template name; ref picks one of several images.
func (c *Client) ImportTemplate(ctx context.Context, name, ref string, tarball io.Reader, size int64) (*Template, error) {
	return c.ImportTemplateWith(ctx, name, tarball, size, ImportOptions{Ref: ref})
}

// ImportOptions are the options of an image import.
type ImportOptions struct {
	// Ref picks one image when the upload holds several (a tag such as
	// "python:3.12"); "" for the only one.
	Ref string
	// Source is what the template's source shows (at most 200 printable
	// bytes); "" for "upload" (ImportTemplatePathWith sends the file's
	// base name).
	Source string
	// StartCmd makes the image's ENTRYPOINT and CMD the template's start
	// command, started in the background in every new session of it.
	StartCmd bool
	// Progress, if not nil, is called as the upload is sent (from the
	// goroutine sending it) with the bytes sent so far and the total (-1
	// when not known), and once with sent == total (or total -1 and done
	// true) when all of it is sent and the daemon unpacks it.
	Progress func(sent, total int64, done bool)
}

// ImportTemplateWith uploads an image tarball of size bytes (-1 if not
// known) as template name, as o says.
func (c *Client) ImportTemplateWith(ctx context.Context, name string, tarball io.Reader, size int64, o ImportOptions) (*Template, error) {
	if err := checkID("template", name); err != nil {
		return nil, err
	}
	q := url.Values{}
	if o.Ref != "" {
		q.Set("ref", o.Ref)
	}
	if o.Source != "" {
		q.Set("source", o.Source)
	}
	if o.StartCmd {
		q.Set("start_cmd", "true")
	}
	if o.Progress != nil {
		tarball = &progressReader{r: tarball, total: size, report: o.Progress}
	}
	resp, err := c.do(ctx, request{method: http.MethodPut, path: "/v1/templates/" + url.PathEscape(name), query: q,
		body: tarball, size: size, contentType: "application/x-tar", accept: "application/json"})
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	t := &Template{}
	return t, decodeBody(resp, t)
}

// progressReader reports how much of r was read.
type progressReader struct {
	r      io.Reader
	sent   int64
	total  int64
	report func(sent, total int64, done bool)
	ended  bool
}

// Read reads from r and reports the bytes read so far (done at EOF).
func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.sent += int64(n)
	if err == io.EOF && !p.ended {
		p.ended = true
		p.report(p.sent, p.total, true)
	} else if n > 0 {
		p.report(p.sent, p.total, false)
	}
	return n, err
}

// Template returns template name (GET /v1/templates/{name}): an
// *Error with status 404 when there is none the caller can see.
func (c *Client) Template(ctx context.Context, name string) (*Template, error) {
	if err := checkID("template", name); err != nil {
		return nil, err
	}
	t := &Template{}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/templates/"+url.PathEscape(name), nil, nil, nil, t)
	return t, err
}

// DeleteTemplate removes a template no session uses.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	if err := checkID("template", name); err != nil {
		return err
	}
	_, err := c.doJSON(ctx, http.MethodDelete, "/v1/templates/"+url.PathEscape(name), nil, nil, nil, nil)
	return err
}
