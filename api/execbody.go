package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/internal/httpjson"
	"github.com/forkbox/forkbox/internal/jsonstream"
	"github.com/forkbox/forkbox/node"
)

// Exec and stdin bodies (up to node.MaxExecBody) are read as a stream:
// a command text or stdin data longer than inlineInput is passed on into
// the sandbox (ExecPrep.Stage) while it arrives, never held whole in the
// daemon. The other members are small and decoded as usual.
const (
	// inlineInput is the longest command text or stdin data kept in the
	// daemon and sent inside the agent request, in bytes.
	inlineInput = 64 << 10
	// maxSmallMembers bounds the other members together (argv, env, cwd,
	// user, tag, ...), in bytes as sent: the kernel takes at most 2 MiB of
	// arguments and environment anyway.
	maxSmallMembers = 1 << 20
	// growStep is how much more of a body without Content-Length is
	// counted in the in-flight budget at a time, in bytes.
	growStep = 1 << 20
)

// execBody is a decoded exec request: the small members in req, a long
// command text or stdin data staged in in, and the audit facts.
type execBody struct {
	req v1.ExecRequest
	in  node.ExecInputs
	// hash is the command's audit hash (audit.CommandHash of its words).
	hash string
	// stdinBytes is the stdin data's length.
	stdinBytes int64
}

// readExecBody reads an exec request body from r for p's session.
func readExecBody(r *http.Request, p node.ExecCall) (*execBody, error) {
	if err := httpjson.CheckMediaType(r.Header.Get("Content-Type")); err != nil {
		return nil, err
	}
	d := jsonstream.NewDecoder(budgetedBody(r, p))
	b := &execBody{}
	smallLeft := maxSmallMembers
	err := decodeObject(d, func(key string) error {
		switch key {
		case "cmd":
			h := sha256.New()
			h.Write([]byte("/bin/sh\x00-c\x00")) // audit.CommandHash("/bin/sh", "-c", cmd)
			inline, staged, err := readLongString(r.Context(), d, p, "cmd", false, h)
			if err != nil {
				return err
			}
			b.req.Cmd, b.in.Script = string(inline), staged
			b.hash = hex.EncodeToString(h.Sum(nil))
			if staged == nil && b.req.Cmd == "" {
				b.hash = ""
			}
			return nil
		case "stdin":
			inline, staged, err := readLongString(r.Context(), d, p, "stdin", true, nil)
			if err != nil {
				return err
			}
			b.req.Stdin, b.in.Stdin = inline, staged
			b.stdinBytes = int64(len(inline))
			if staged != nil {
				b.stdinBytes = staged.Size
			}
			return nil
		}
		target := smallMember(&b.req, key)
		if target == nil {
			return errdefs.InvalidField(key, "unknown field")
		}
		raw, err := d.Raw(smallLeft)
		if errors.Is(err, jsonstream.ErrTooLarge) {
			return errdefs.InvalidField(key, "the members other than cmd and stdin are larger than %d bytes together "+
				"(the kernel takes at most 2 MiB of arguments and environment; pass data as stdin or cmd)", maxSmallMembers)
		}
		if err != nil {
			return err
		}
		smallLeft -= len(raw)
		return httpjson.DecodeMember(key, raw, target)
	})
	if err != nil {
		return nil, err
	}
	if len(b.req.Argv) > 0 {
		b.hash = audit.CommandHash(b.req.Argv...)
	}
	return b, nil
}

// smallMember returns the field of req that member key decodes into, or
// nil for an unknown member (cmd and stdin are read as streams).
func smallMember(req *v1.ExecRequest, key string) any {
	switch key {
	case "argv":
		return &req.Argv
	case "env":
		return &req.Env
	case "cwd":
		return &req.Cwd
	case "user":
		return &req.User
	case "timeout_s":
		return &req.TimeoutS
	case "keep_stdin":
		return &req.KeepStdin
	case "background":
		return &req.Background
	case "tag":
		return &req.Tag
	}
	return nil
}

// readStdinBody reads a stdin request body ({data, close}) like an exec body.
func readStdinBody(r *http.Request, p node.ExecCall) (inline []byte, staged *node.Staged, closeAfter bool, size int64, err error) {
	if err := httpjson.CheckMediaType(r.Header.Get("Content-Type")); err != nil {
		return nil, nil, false, 0, err
	}
	d := jsonstream.NewDecoder(budgetedBody(r, p))
	err = decodeObject(d, func(key string) error {
		switch key {
		case "data":
			var err error
			inline, staged, err = readLongString(r.Context(), d, p, "data", true, nil)
			return err
		case "close":
			raw, err := d.Raw(64)
			if err != nil {
				return err
			}
			return httpjson.DecodeMember(key, raw, &closeAfter)
		}
		return errdefs.InvalidField(key, "unknown field")
	})
	size = int64(len(inline))
	if staged != nil {
		size = staged.Size
	}
	return inline, staged, closeAfter, size, err
}

// decodeObject reads one JSON object from d, calling member for each key
// (once: a key given twice is an error) to read its value, then checks
// that nothing follows. Errors are field errors as httpjson.Decode makes them.
func decodeObject(d *jsonstream.Decoder, member func(key string) error) error {
	err := func() error {
		if err := d.Begin(); err != nil {
			if errors.Is(err, io.EOF) {
				return errdefs.InvalidField("body", "is empty; a JSON object is required")
			}
			return err
		}
		seen := map[string]bool{}
		for {
			key, ok, err := d.Key()
			if err != nil {
				return err
			}
			if !ok {
				break
			}
			if seen[key] {
				return errdefs.InvalidField(key, "given twice")
			}
			seen[key] = true
			if err := member(key); err != nil {
				return err
			}
		}
		if err := d.End(); err != nil {
			var syn *jsonstream.SyntaxError
			if errors.As(err, &syn) {
				return errdefs.InvalidField("body", "has data after the JSON object")
			}
			return err
		}
		return nil
	}()
	return bodyError(err)
}

// bodyError maps what reading a body failed with to a classed error.
func bodyError(err error) error {
	var syn *jsonstream.SyntaxError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &syn):
		return errdefs.InvalidField("body", "malformed JSON at byte %d: %s", syn.Offset, syn.Msg)
	case errdefs.Class(err) != errdefs.ErrInternal:
		return err // a field error, a refusal, a sandbox that cannot hold it
	}
	return httpjson.BodyError(err)
}

// budgetedBody returns r's body limited to node.MaxExecBody, counting
// bytes beyond the declared Content-Length in p's in-flight budget as
// they arrive.
func budgetedBody(r *http.Request, p node.ExecCall) io.Reader {
	body := http.MaxBytesReader(nil, r.Body, node.MaxExecBody)
	counted := max(r.ContentLength, 0)
	var read int64
	return readerFunc(func(b []byte) (int, error) {
		if read+int64(len(b)) > counted {
			if err := p.GrowBody(growStep); err != nil {
				return 0, err
			}
			counted += growStep
		}
		n, err := body.Read(b)
		read += int64(n)
		return n, err
	})
}

// readLongString reads the next value (a string or null) of member field:
// its decoded bytes (base64-decoded too, with isBase64) are returned
// inline when they are at most inlineInput long, else staged in p's
// sandbox while they arrive. A command text must not hold NUL bytes; h,
// when set, hashes it.
func readLongString(ctx context.Context, d *jsonstream.Decoder, p node.ExecCall, field string, isBase64 bool, h hash.Hash) ([]byte, *node.Staged, error) {
	c, err := d.Peek()
	if err != nil {
		return nil, nil, err
	}
	if c == 'n' {
		raw, err := d.Raw(8)
		if err == nil && string(raw) != "null" {
			err = errdefs.InvalidField(field, "must be a string")
		}
		return nil, nil, err
	}
	if c != '"' {
		raw, _ := d.Raw(1 << 10)
		var s string
		return nil, nil, httpjson.DecodeMember(field, raw, &s)
	}
	sp := &spill{ctx: ctx, p: p, hash: h, noNUL: !isBase64}
	if !isBase64 {
		_, err = d.String(sp)
	} else {
		// The string's text is base64 (encoding/json's form of []byte):
		// decoded through a pipe, as it arrives.
		pr, pw := io.Pipe()
		decoded := make(chan error, 1)
		go func() {
			b64 := base64.NewDecoder(base64.StdEncoding, pr)
			_, err := io.Copy(sp, readerFunc(func(b []byte) (int, error) {
				n, err := b64.Read(b)
				var corrupt base64.CorruptInputError
				switch {
				case errors.As(err, &corrupt):
					err = errdefs.InvalidField(field, "must be base64 (RFC 4648, padded): bad byte at %d", int64(corrupt))
				case errors.Is(err, io.ErrUnexpectedEOF):
					err = errdefs.InvalidField(field, "must be base64 (RFC 4648, padded): its length is not a multiple of 4")
				}
				return n, err
			}))
			pr.CloseWithError(err)
			decoded <- err
		}()
		_, err = d.String(pw)
		pw.CloseWithError(err)
		if derr := <-decoded; err == nil || errors.Is(err, io.ErrClosedPipe) {
			err = derr
		}
	}
	if err != nil {
		sp.abort(err)
		return nil, nil, err
	}
	inline, staged, err := sp.finish()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", field, err)
	}
	return inline, staged, nil
}

// spill keeps up to inlineInput bytes and passes longer input on into
// the sandbox (a stage fed through a pipe while it arrives).
type spill struct {
	ctx   context.Context
	p     node.ExecCall
	hash  hash.Hash
	noNUL bool

	buf  []byte
	pw   *io.PipeWriter
	done chan stageResult
}

type stageResult struct {
	staged node.Staged
	err    error
}

func (s *spill) Write(b []byte) (int, error) {
	if s.noNUL && bytes.IndexByte(b, 0) >= 0 {
		return 0, errdefs.InvalidField("cmd", "contains a NUL byte")
	}
	if s.hash != nil {
		s.hash.Write(b)
	}
	if s.pw == nil && len(s.buf)+len(b) <= inlineInput {
		s.buf = append(s.buf, b...)
		return len(b), nil
	}
	if s.pw == nil {
		pr, pw := io.Pipe()
		s.pw, s.done = pw, make(chan stageResult, 1)
		go func() {
			st, err := s.p.Stage(s.ctx, pr)
			pr.CloseWithError(err) // a refusal ends the writes with its error
			s.done <- stageResult{st, err}
		}()
		if _, err := pw.Write(s.buf); err != nil {
			return 0, s.stageErr(err)
		}
		s.buf = nil
	}
	if _, err := s.pw.Write(b); err != nil {
		return 0, s.stageErr(err)
	}
	return len(b), nil
}

// stageErr returns the stage's own error when a write to its pipe failed
// because the stage ended.
func (s *spill) stageErr(err error) error {
	s.pw.CloseWithError(err)
	r := <-s.done
	s.done <- r
	if r.err != nil {
		return r.err
	}
	return err
}

// finish returns the input: inline, or staged once the stage is complete.
func (s *spill) finish() ([]byte, *node.Staged, error) {
	if s.pw == nil {
		return s.buf, nil, nil
	}
	s.pw.Close()
	r := <-s.done
	s.done <- r
	if r.err != nil {
		return nil, nil, r.err
	}
	return nil, &r.staged, nil
}

// abort ends a stage begun for an input that turned out bad (the staged
// part is dropped when the exec closes, or expires in the agent).
func (s *spill) abort(err error) {
	if s.pw != nil {
		s.pw.CloseWithError(err)
		r := <-s.done
		s.done <- r
	}
}
