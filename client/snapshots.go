package client

import (
	"context"
	"net/http"
	"net/url"

	v1 "github.com/forkbox/forkbox/api/v1"
)

// Snapshot captures session id's files as a snapshot; expiresInS > 0
// deletes it after that many seconds. The session keeps running.
func (c *Client) Snapshot(ctx context.Context, id string, expiresInS int64) (*Snapshot, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	return c.SnapshotWith(ctx, id, v1.SnapshotRequest{ExpiresInS: expiresInS})
}

// SnapshotWith snapshots session id as req asks (req.Memory: processes and
// memory too, gVisor tier).
func (c *Client) SnapshotWith(ctx context.Context, id string, req SnapshotRequest) (*Snapshot, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	sn := &Snapshot{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/snapshot", nil, nil, req, sn)
	return sn, err
}

// ForkSession snapshots session id and starts req.Count sessions from it.
func (c *Client) ForkSession(ctx context.Context, id string, req ForkRequest) (*ForkResult, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	out := &ForkResult{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/fork", nil, nil, req, out)
	return out, err
}

// ForkSnapshot starts req.Count sessions from snapshot snapID.
func (c *Client) ForkSnapshot(ctx context.Context, snapID string, req ForkRequest) (*ForkResult, error) {
	if err := checkID("snapshot", snapID); err != nil {
		return nil, err
	}
	out := &ForkResult{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/snapshots/"+url.PathEscape(snapID)+"/fork", nil, nil, req, out)
	return out, err
}

// Snapshots lists snapshots, newest first.
func (c *Client) Snapshots(ctx context.Context) ([]Snapshot, error) {
	var out v1.SnapshotList
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots", nil, nil, nil, &out)
	return out.Snapshots, err
}

// GetSnapshot returns one snapshot.
func (c *Client) GetSnapshot(ctx context.Context, id string) (*Snapshot, error) {
	if err := checkID("snapshot", id); err != nil {
		return nil, err
	}
	sn := &Snapshot{}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(id), nil, nil, nil, sn)
	return sn, err
}

// DeleteSnapshot deletes a snapshot; with force also the sessions and child
// snapshots that depend on it.
func (c *Client) DeleteSnapshot(ctx context.Context, id string, force bool) error {
	if err := checkID("snapshot", id); err != nil {
		return err
	}
	var q url.Values
	if force {
		q = url.Values{"force": {"true"}}
	}
	_, err := c.doJSON(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(id), q, nil, nil, nil)
	return err
}

// Pause freezes session id (its timeout clock stops).
func (c *Client) Pause(ctx context.Context, id string) (*Session, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	s := &Session{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/pause", nil, nil, nil, s)
	return s, err
}

// Resume thaws a paused session.
func (c *Client) Resume(ctx context.Context, id string) (*Session, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	s := &Session{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/resume", nil, nil, nil, s)
	return s, err
}

// Pools lists the warm pools with their depth.
func (c *Client) Pools(ctx context.Context) ([]Pool, error) {
	var out v1.PoolList
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/pools", nil, nil, nil, &out)
	return out.Pools, err
}

// SetPool sets a template's warm pool (Size 0 empties it).
func (c *Client) SetPool(ctx context.Context, p Pool) (*Pool, error) {
	if err := checkID("template", p.Template); err != nil {
		return nil, err
	}
	out := &Pool{}
	_, err := c.doJSON(ctx, http.MethodPut, "/v1/pools/"+url.PathEscape(p.Template), nil, nil, p, out)
	return out, err
}

// Migrate moves session id to the fleet host named host ("": the fleet
// picks one) and returns the new session, which has a new id: the old id
// is gone once this returns. On gVisor the session keeps its processes
// and memory; on runc only its files move and its processes restart from
// the image's start. A failure leaves the session where it was, running.
func (c *Client) Migrate(ctx context.Context, id, host string) (*Session, error) {
	if err := checkID("session", id); err != nil {
		return nil, err
	}
	s := &Session{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/sessions/"+url.PathEscape(id)+"/migrate", nil, nil, v1.MigrateRequest{Host: host}, s)
	return s, err
}
