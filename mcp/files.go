package mcp

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkbox/forkbox/client"
)

// Bounds of read_file and of a file resource, in bytes.
const (
	defaultReadBytes = 64 << 10
	maxReadBytes     = 1 << 20
	maxResourceBytes = 1 << 20
)

// ReadInput is read_file's input.
type ReadInput struct {
	SandboxRef
	Path     string `json:"path" jsonschema:"absolute path of the file in the sandbox (/home/user/notes.txt)"`
	Offset   int64  `json:"offset,omitempty" jsonschema:"byte offset to start reading at (to read a long file in parts)"`
	MaxBytes int    `json:"max_bytes,omitempty" jsonschema:"most bytes returned (default 65536, at most 1048576)"`
}

// ReadOutput is read_file's output.
type ReadOutput struct {
	Path     string `json:"path"`
	Offset   int64  `json:"offset"`
	Bytes    int    `json:"bytes" jsonschema:"bytes returned"`
	More     bool   `json:"more" jsonschema:"the file goes on past what was returned: read again at offset+bytes"`
	Encoding string `json:"encoding" jsonschema:"utf-8, or base64 for a file that is not UTF-8 text"`
	Content  string `json:"content"`
}

// WriteInput is write_file's input.
type WriteInput struct {
	SandboxRef
	Path     string `json:"path" jsonschema:"absolute path of the file in the sandbox; missing parent directories are made; an existing file is replaced"`
	Content  string `json:"content" jsonschema:"the file's contents"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf-8 (the default) or base64 (content is base64 of binary data)"`
}

// ListFilesInput is list_files' input.
type ListFilesInput struct {
	SandboxRef
	Path  string `json:"path" jsonschema:"absolute path of the directory"`
	Depth int    `json:"depth,omitempty" jsonschema:"levels to list: 1 (the default) lists the directory's entries, 2 also theirs, and so on"`
}

// FileEntry is one entry of list_files and write_file's answer.
type FileEntry struct {
	Path        string    `json:"path"`
	Type        string    `json:"type" jsonschema:"file, dir or symlink"`
	Size        int64     `json:"size"`
	Permissions string    `json:"permissions"`
	Owner       string    `json:"owner"`
	ModifiedAt  time.Time `json:"modified_at"`
	Target      string    `json:"symlink_target,omitempty"`
}

// FileList is list_files' output.
type FileList struct {
	Entries []FileEntry `json:"entries"`
}

func entry(e *client.Entry) FileEntry {
	return FileEntry{Path: e.Path, Type: e.Type, Size: e.Size, Permissions: e.Permissions, Owner: e.Owner,
		ModifiedAt: e.ModifiedAt, Target: e.SymlinkTarget}
}

func (t *tools) addFileTools(s *sdk.Server) {
	add(t, s, "read_file", "Read a file of a sandbox (UTF-8 text as is, anything else as base64). "+
		"Long files are returned in parts: read again from offset+bytes while more is true.", nil, t.readFile)
	add(t, s, "write_file", "Write a file in a sandbox, making missing parent directories; replaces an existing file.",
		map[string][]any{"encoding": {"utf-8", "base64"}}, t.writeFile)
	add(t, s, "list_files", "List a directory of a sandbox: each entry's path, type, size, permissions, owner and modification time.",
		nil, func(ctx context.Context, in ListFilesInput) (*sdk.CallToolResult, FileList, error) {
			if err := absolute(in.Path); err != nil {
				return nil, FileList{}, err
			}
			if in.Depth == 0 {
				in.Depth = 1
			}
			es, err := t.c.ListDir(ctx, in.SandboxID, in.Path, in.Depth, "")
			out := FileList{Entries: []FileEntry{}}
			for i := range es {
				out.Entries = append(out.Entries, entry(&es[i]))
			}
			return nil, out, err
		})
}

// readFile is read_file.
func (t *tools) readFile(ctx context.Context, in ReadInput) (*sdk.CallToolResult, ReadOutput, error) {
	if err := absolute(in.Path); err != nil {
		return nil, ReadOutput{}, err
	}
	bound := in.MaxBytes
	switch {
	case bound == 0:
		bound = defaultReadBytes
	case bound < 0 || bound > maxReadBytes:
		return nil, ReadOutput{}, fmt.Errorf("max_bytes must be between 1 and %d", maxReadBytes)
	}
	if in.Offset < 0 {
		return nil, ReadOutput{}, fmt.Errorf("offset must not be negative")
	}
	rc, err := t.c.Download(ctx, in.SandboxID, in.Path, "")
	if err != nil {
		return nil, ReadOutput{}, err
	}
	defer rc.Close()
	if _, err := io.CopyN(io.Discard, rc, in.Offset); err != nil && !errors.Is(err, io.EOF) {
		return nil, ReadOutput{}, err
	}
	b, err := io.ReadAll(io.LimitReader(rc, int64(bound)+1))
	if err != nil {
		return nil, ReadOutput{}, err
	}
	out := ReadOutput{Path: in.Path, Offset: in.Offset, Encoding: "utf-8"}
	if len(b) > bound {
		b, out.More = b[:bound], true
		// A part ends on a character boundary when the text is UTF-8.
		for i := 0; i < utf8.UTFMax && !utf8.Valid(b) && len(b) > 1; i++ {
			b = b[:len(b)-1]
		}
	}
	out.Bytes = len(b)
	if utf8.Valid(b) {
		out.Content = string(b)
	} else {
		out.Encoding, out.Content = "base64", base64.StdEncoding.EncodeToString(b)
	}
	return nil, out, nil
}

// writeFile is write_file.
func (t *tools) writeFile(ctx context.Context, in WriteInput) (*sdk.CallToolResult, FileEntry, error) {
	if err := absolute(in.Path); err != nil {
		return nil, FileEntry{}, err
	}
	data := []byte(in.Content)
	switch in.Encoding {
	case "", "utf-8":
	case "base64":
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, FileEntry{}, fmt.Errorf("content is not valid base64: %v", err)
		}
	default:
		return nil, FileEntry{}, fmt.Errorf("encoding must be utf-8 or base64")
	}
	e, err := t.c.Upload(ctx, in.SandboxID, in.Path, strings.NewReader(string(data)), int64(len(data)), "")
	if err != nil {
		return nil, FileEntry{}, err
	}
	return nil, entry(e), nil
}

// absolute refuses a path that is not absolute.
func absolute(p string) error {
	if !strings.HasPrefix(p, "/") {
		return fmt.Errorf("path %q is not absolute: give the full path in the sandbox (such as /home/user/%s)", p, strings.TrimPrefix(p, "./"))
	}
	return nil
}

// fileTemplate is the URI template of a sandbox's files.
const fileTemplate = "forkbox://sandbox/{id}/files/{+path}"

// addFileResources registers the resource template of sandboxes' files.
func addFileResources(s *sdk.Server, c *client.Client) {
	s.AddResourceTemplate(&sdk.ResourceTemplate{
		Name: "sandbox-file", Title: "A file in a sandbox", URITemplate: fileTemplate,
		Description: fmt.Sprintf("The contents of a file in a forkbox sandbox: forkbox://sandbox/SANDBOX_ID/files/ABSOLUTE/PATH "+
			"(the path without its leading slash). Files over %d bytes are refused: read those with read_file in parts.", maxResourceBytes),
	}, func(ctx context.Context, req *sdk.ReadResourceRequest) (*sdk.ReadResourceResult, error) {
		return readResource(ctx, c, req.Params.URI)
	})
}

// readResource reads the file that uri (of fileTemplate) names: text as
// text/plain when it is UTF-8, else a blob.
func readResource(ctx context.Context, c *client.Client, uri string) (*sdk.ReadResourceResult, error) {
	u, err := url.Parse(uri)
	if err != nil || u.Scheme != "forkbox" || u.Host != "sandbox" {
		return nil, sdk.ResourceNotFoundError(uri)
	}
	id, p, ok := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/files/")
	if !ok || needSandbox(id) != nil || p == "" {
		return nil, sdk.ResourceNotFoundError(uri)
	}
	rc, err := c.Download(ctx, id, "/"+p, "")
	if client.IsNotFound(err) {
		return nil, sdk.ResourceNotFoundError(uri)
	}
	if err != nil {
		return nil, errors.New(Describe(err))
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxResourceBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxResourceBytes {
		return nil, fmt.Errorf("%s is larger than the %d bytes a resource may hold: read it with read_file (offset, max_bytes)", "/"+p, maxResourceBytes)
	}
	rcs := &sdk.ResourceContents{URI: uri}
	if utf8.Valid(b) {
		rcs.MIMEType, rcs.Text = "text/plain", string(b)
	} else {
		rcs.MIMEType, rcs.Blob = "application/octet-stream", b
	}
	return &sdk.ReadResourceResult{Contents: []*sdk.ResourceContents{rcs}}, nil
}
