package client

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	v1 "github.com/forkbox/forkbox/api/v1"
)

// The tenant and key calls need an admin key; a tenant key gets an *Error
// unwrapping to errdefs.ErrPermissionDenied. Audit and ExportAudit work with
// any key.

// CreateTenant creates tenant name (1-63 lower-case letters, digits and
// '-', starting with a letter) with policy p and returns it. A taken name
// is errdefs.ErrConflict; a bad name or policy errdefs.ErrInvalidArgument.
func (c *Client) CreateTenant(ctx context.Context, name string, p TenantPolicy) (*Tenant, error) {
	if err := checkID("tenant", name); err != nil {
		return nil, err
	}
	t := &Tenant{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/tenants", nil, nil, TenantRequest{Name: name, Policy: p}, t)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// Tenants lists every tenant with its current sessions and today's CPU use.
func (c *Client) Tenants(ctx context.Context) ([]Tenant, error) {
	var out v1.TenantList
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/tenants", nil, nil, nil, &out)
	return out.Tenants, err
}

// GetTenant returns tenant name; an unknown one is errdefs.ErrNotFound.
func (c *Client) GetTenant(ctx context.Context, name string) (*Tenant, error) {
	if err := checkID("tenant", name); err != nil {
		return nil, err
	}
	t := &Tenant{}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/tenants/"+url.PathEscape(name), nil, nil, nil, t)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// UpdateTenant replaces tenant name's whole policy with p (fields left zero
// no longer limit) and, with clearFlag, clears its abuse flag. It returns
// the updated tenant; an unknown one is errdefs.ErrNotFound, a bad policy
// errdefs.ErrInvalidArgument.
func (c *Client) UpdateTenant(ctx context.Context, name string, p TenantPolicy, clearFlag bool) (*Tenant, error) {
	if err := checkID("tenant", name); err != nil {
		return nil, err
	}
	t := &Tenant{}
	_, err := c.doJSON(ctx, http.MethodPut, "/v1/tenants/"+url.PathEscape(name), nil, nil,
		TenantRequest{Policy: p, ClearFlag: clearFlag}, t)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// DeleteTenant deletes tenant name and its keys. While it has sessions or
// snapshots that is errdefs.ErrConflict unless force, which destroys them
// too. An unknown tenant is errdefs.ErrNotFound.
func (c *Client) DeleteTenant(ctx context.Context, name string, force bool) error {
	if err := checkID("tenant", name); err != nil {
		return err
	}
	var q url.Values
	if force {
		q = url.Values{"force": {"true"}}
	}
	_, err := c.doJSON(ctx, http.MethodDelete, "/v1/tenants/"+url.PathEscape(name), q, nil, nil, nil)
	return err
}

// CreateKey makes an API key for tenant, named name (may be ""); admin
// keys manage tenants and keys and read every tenant's audit records. The
// returned NewKey holds the secret, which cannot be read again. An unknown
// tenant is errdefs.ErrNotFound.
func (c *Client) CreateKey(ctx context.Context, tenant, name string, admin bool) (*NewKey, error) {
	if err := checkID("tenant", tenant); err != nil {
		return nil, err
	}
	k := &NewKey{}
	_, err := c.doJSON(ctx, http.MethodPost, "/v1/tenants/"+url.PathEscape(tenant)+"/keys", nil, nil,
		KeyRequest{Name: name, Admin: admin}, k)
	if err != nil {
		return nil, err
	}
	return k, nil
}

// Keys lists API keys (without secrets, revoked ones included); tenant ""
// lists every tenant's.
func (c *Client) Keys(ctx context.Context, tenant string) ([]APIKey, error) {
	var q url.Values
	if tenant != "" {
		q = url.Values{"tenant": {tenant}}
	}
	var out v1.KeyList
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/keys", q, nil, nil, &out)
	return out.Keys, err
}

// RevokeKey revokes API key id; it stops authenticating at once. An unknown
// id is errdefs.ErrNotFound.
func (c *Client) RevokeKey(ctx context.Context, id string) error {
	if err := checkID("key", id); err != nil {
		return err
	}
	_, err := c.doJSON(ctx, http.MethodDelete, "/v1/keys/"+url.PathEscape(id), nil, nil, nil, nil)
	return err
}

// AuditFilter selects audit records for Audit and ExportAudit. Zero fields
// do not filter.
type AuditFilter struct {
	// Tenant: a tenant key may only name its own tenant (or leave it
	// empty, which means its own); admin keys see every tenant's records.
	Tenant  string
	Session string
	// Kind is an exact kind ("exec") or a prefix ending in "."
	// ("session.").
	Kind string
	// Outcome is ok, error or denied.
	Outcome string
	// Since and Until bound the records' time.
	Since, Until time.Time
	// After skips records up to this seq (AuditList.Next pages on).
	After int64
	// Limit is Audit's page size, 1-1000 (default 100); ExportAudit ignores
	// it.
	Limit int
}

func (f AuditFilter) query() url.Values {
	q := url.Values{}
	for k, v := range map[string]string{"tenant": f.Tenant, "session": f.Session, "kind": f.Kind, "outcome": f.Outcome} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if !f.Since.IsZero() {
		q.Set("since", f.Since.UTC().Format(time.RFC3339Nano))
	}
	if !f.Until.IsZero() {
		q.Set("until", f.Until.UTC().Format(time.RFC3339Nano))
	}
	if f.After > 0 {
		q.Set("after", strconv.FormatInt(f.After, 10))
	}
	return q
}

// Audit returns one page of the audit records matching f, oldest first;
// when the page is full, the list's Next is the After of the next page. A
// tenant key asking for another tenant is errdefs.ErrPermissionDenied.
func (c *Client) Audit(ctx context.Context, f AuditFilter) (*AuditList, error) {
	q := f.query()
	if f.Limit > 0 {
		q.Set("limit", strconv.Itoa(f.Limit))
	}
	out := &AuditList{}
	_, err := c.doJSON(ctx, http.MethodGet, "/v1/audit", q, nil, nil, out)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ExportAudit copies every audit record matching f (f.Limit is ignored) to
// w as JSON lines, one AuditRecord per line, oldest first. Errors before
// the stream starts are *Error values as elsewhere; a stream cut short
// returns the copy's error (w may then hold a partial last line).
func (c *Client) ExportAudit(ctx context.Context, f AuditFilter, w io.Writer) error {
	q := f.query()
	q.Set("format", "jsonl")
	resp, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/audit", query: q, accept: "application/x-ndjson"})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(w, resp.Body); err != nil {
		return fmt.Errorf("audit export: %w", err)
	}
	return nil
}
