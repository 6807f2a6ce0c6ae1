package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	v1 "github.com/forkbox/forkbox/api/v1"
)

// Types of diffs, merges and fork-and-run.
type (
	FileChange   = v1.FileChange
	Diff         = v1.Diff
	MergeRequest = v1.MergeRequest
	MergeResult  = v1.MergeResult
	ForkRun      = v1.ForkRun
	ForkScore    = v1.ForkScore
	ForkEvent    = v1.ForkEvent
)

func diffQuery(base string, patch bool) url.Values {
	q := url.Values{}
	if base != "" {
		q.Set("base", base)
	}
	if patch {
		q.Set("patch", "true")
	}
	return q
}

// SessionDiff lists what session id changed relative to snapshot base
// ("": the one it started from); patch adds text files' unified diffs.
func (c *Client) SessionDiff(ctx context.Context, id, base string, patch bool) (*Diff, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	out := &Diff{}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/sessions/"+url.PathEscape(id)+"/diff", diffQuery(base, patch), nil, nil, out)
	return out, err
}

// SnapshotDiff lists what snapshot id holds relative to snapshot base
// ("": its parent).
func (c *Client) SnapshotDiff(ctx context.Context, id, base string, patch bool) (*Diff, error) {
	if err := checkID("snapshot", id); err != nil {
		return nil, err
	}
	out := &Diff{}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(id)+"/diff", diffQuery(base, patch), nil, nil, out)
	return out, err
}

// Merge applies what req.From changed into session id. A conflict with
// on_conflict "fail" is an *Error with status 409 whose Paths lists
// every conflicting path.
func (c *Client) Merge(ctx context.Context, id string, req MergeRequest) (*MergeResult, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	out := &MergeResult{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/merge", nil, nil, req, out)
	return out, err
}

// ForkRun forks req.Count children from snapshot snapID, runs req.Run in
// each and calls onChild with each child's result as it ends; it returns
// the final "done" event (the kept and destroyed children). req.Run must
// be set.
func (c *Client) ForkRun(ctx context.Context, snapID string, req ForkRequest, onChild func(ForkEvent)) (*ForkEvent, error) {
	if err := checkID("snapshot", snapID); err != nil {
		return nil, err
	}
	if req.Run == nil {
		return nil, fmt.Errorf("fork and run: no command")
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	resp, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/snapshots/" + url.PathEscape(snapID) + "/fork",
		body: bytes.NewReader(b), size: int64(len(b)), contentType: "application/json", accept: "application/x-ndjson"})
	if err != nil {
		return nil, err
	}
	defer closeBody(resp)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev ForkEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("decode a fork-and-run line: %w", err)
		}
		switch ev.Type {
		case "child":
			if onChild != nil {
				onChild(ev)
			}
		case "done":
			return &ev, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("fork and run: the stream ended before its done line")
}
