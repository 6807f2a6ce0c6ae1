package client

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/internal/tartree"
)

// BuildRequest is a Dockerfile build's spec (see v1.TemplateBuildRequest).
type BuildRequest = v1.TemplateBuildRequest

// TemplateBuild is a finished build: the template and its steps.
type TemplateBuild = v1.TemplateBuild

// BuildEvent is one event of a streamed build: Kind is "step", "done",
// "log" or "failed" (see v1.BuildEvent).
type BuildEvent struct {
	Kind string
	v1.BuildEvent
}

// BuildOptions are where a build's context comes from and where its
// progress goes.
type BuildOptions struct {
	// ContextDir is a directory sent as the build context (its
	// directories, regular files and symlinks, as a tar); "": none.
	ContextDir string
	// Progress, when not nil, gets the build's events as the daemon
	// sends them.
	Progress func(BuildEvent)
}

// BuildTemplate builds template name from req.Dockerfile on the daemon
// (POST /v1/templates/{name}/build), sending o.ContextDir as the build
// context. It returns the finished build; a failed RUN is an *Error
// typed build-step-failed whose detail has the exit code and the last
// output, and o.Progress saw a "failed" event with the exit code.
func (c *Client) BuildTemplate(ctx context.Context, name string, req BuildRequest, o BuildOptions) (*TemplateBuild, error) {
	if err := checkID("template", name); err != nil {
		return nil, err
	}
	spec, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		pw.CloseWithError(writeBuildBody(mw, spec, o.ContextDir))
	}()
	defer pr.Close()
	r := request{method: http.MethodPost, path: "/v1/templates/" + url.PathEscape(name) + "/build", body: pr, size: -1,
		contentType: mw.FormDataContentType(), accept: "text/event-stream"}
	resp, err := c.do(ctx, r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		b := &TemplateBuild{}
		return b, decodeBody(resp, b)
	}
	var out *TemplateBuild
	err = readEvents(resp.Body, func(event, data string) error {
		switch event {
		case "build":
			out = &TemplateBuild{}
			return json.Unmarshal([]byte(data), out)
		case "error":
			e := &Error{}
			if err := json.Unmarshal([]byte(data), e); err != nil {
				return fmt.Errorf("build failed: %s", data)
			}
			return e
		default:
			ev := BuildEvent{Kind: event}
			if err := json.Unmarshal([]byte(data), &ev.BuildEvent); err != nil {
				return fmt.Errorf("bad %s event: %w", event, err)
			}
			if o.Progress != nil {
				o.Progress(ev)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if out == nil {
		return nil, fmt.Errorf("build stream ended without a result")
	}
	return out, nil
}

// writeBuildBody writes the multipart body: the spec part, then the
// context directory as a tar part (when dir is not "").
func writeBuildBody(mw *multipart.Writer, spec []byte, dir string) error {
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="spec"`)
	h.Set("Content-Type", "application/json")
	pw, err := mw.CreatePart(h)
	if err != nil {
		return err
	}
	if _, err := pw.Write(spec); err != nil {
		return err
	}
	if dir != "" {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="context"; filename="context.tar"`)
		h.Set("Content-Type", "application/x-tar")
		cw, err := mw.CreatePart(h)
		if err != nil {
			return err
		}
		if err := tartree.Write(cw, dir); err != nil {
			return fmt.Errorf("pack the build context %s: %w", dir, err)
		}
	}
	return mw.Close()
}
