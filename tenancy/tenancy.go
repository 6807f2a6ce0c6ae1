// Package tenancy carries who is calling through a request's context: the
// tenant, the API key and the request's correlation ids. The HTTP edge
// (package api) sets it once a key authenticates; the sandbox manager
// reads it to scope lookups to the tenant, apply the tenant's policy and
// stamp audit records.
package tenancy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"regexp"

	"github.com/forkbox/forkbox/errdefs"
)

// Caller is the authenticated caller of one request.
type Caller struct {
	// Tenant owns everything the request makes and is the only tenant
	// whose sessions, snapshots and templates it sees.
	Tenant string
	// KeyID is the API key's id; Admin whether it is an admin key.
	KeyID string
	Admin bool
	// RequestID is the request's X-Request-Id; IdempotencyKey its
	// Idempotency-Key header ("" for none).
	RequestID      string
	IdempotencyKey string
}

type callerKey struct{}

// With returns ctx carrying c.
func With(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// From returns the caller ctx carries; ok is false for forkbox's own work
// (timeouts, janitors, the abuse detector), which sees every tenant.
func From(ctx context.Context) (c Caller, ok bool) {
	c, ok = ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// Visible reports whether a caller with ctx may see a resource of owner:
// forkbox's own work sees all; a caller sees its own tenant's, and shared
// resources (owner "") are visible to all.
func Visible(ctx context.Context, owner string) bool {
	c, ok := From(ctx)
	return !ok || owner == "" || owner == c.Tenant
}

// Owns reports whether a caller with ctx may touch a resource owned by
// owner that is never shared (a session, a snapshot): forkbox's own work
// may; a caller only when owner is its tenant (a warm-pool member, owned by
// nobody, is no caller's).
func Owns(ctx context.Context, owner string) bool {
	c, ok := From(ctx)
	return !ok || (owner != "" && owner == c.Tenant)
}

// TenantOf returns the tenant of ctx's caller, or def for forkbox's own work.
func TenantOf(ctx context.Context, def string) string {
	if c, ok := From(ctx); ok {
		return c.Tenant
	}
	return def
}

var nameRE = regexp.MustCompile(`^[a-z][a-z0-9-]{0,62}$`)

// ValidateName checks a tenant name: 1-63 lower-case letters, digits and
// '-', starting with a letter. ErrInvalidArgument naming field otherwise.
func ValidateName(field, name string) error {
	if !nameRE.MatchString(name) {
		return errdefs.InvalidField(field, "must be 1-63 lower-case letters, digits and '-', starting with a letter")
	}
	return nil
}

// NewKey returns a new API key's id ("key_" and 12 hex digits) and secret
// ("e2b_" and 40 hex digits: the shape E2B SDKs accept, so one key serves
// the forkbox and E2B APIs).
func NewKey() (id, secret string) {
	b := make([]byte, 26)
	_, _ = rand.Read(b)
	return "key_" + hex.EncodeToString(b[:6]), "e2b_" + hex.EncodeToString(b[6:])
}
