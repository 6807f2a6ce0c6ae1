package client_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

func testSnapshots(t *testing.T, c *client.Client) {
	s := newSession(t, c, client.CreateRequest{})
	ctx := ctxFor(t, 5*time.Minute)
	if _, err := c.Upload(ctx, s.ID, "/home/user/mark", strings.NewReader("v1"), 2, ""); err != nil {
		t.Fatal(err)
	}
	sn, err := c.Snapshot(ctx, s.ID, 0)
	if err != nil || sn.ID == "" || sn.SessionID != s.ID || sn.ExpiresAt != nil {
		t.Fatalf("Snapshot: %+v, %v", sn, err)
	}
	exp, err := c.SnapshotWith(ctx, s.ID, client.SnapshotRequest{ExpiresInS: 3600})
	if err != nil || exp.ExpiresAt == nil || time.Until(*exp.ExpiresAt) < 3000*time.Second {
		t.Fatalf("SnapshotWith an expiry: %+v, %v; want it to expire in about an hour", exp, err)
	}
	if got, err := c.GetSnapshot(ctx, sn.ID); err != nil || got.ID != sn.ID || got.Digest != sn.Digest {
		t.Fatalf("GetSnapshot: %+v, %v", got, err)
	}
	if all, err := c.Snapshots(ctx); err != nil || len(all) < 2 {
		t.Fatalf("Snapshots: %+v, %v", all, err)
	}
	// The source changes after the snapshot; forks start from the snapshot.
	if _, err := c.Upload(ctx, s.ID, "/home/user/mark", strings.NewReader("v2"), 2, ""); err != nil {
		t.Fatal(err)
	}
	small := client.CreateRequest{DiskMB: 256}
	fromSnap, err := c.ForkSnapshot(ctx, sn.ID, client.ForkRequest{Count: 2, CreateRequest: small})
	if err != nil || len(fromSnap.Sessions) != 2 || fromSnap.Snapshot.ID != sn.ID {
		t.Fatalf("ForkSnapshot: %+v, %v", fromSnap, err)
	}
	fromSession, err := c.ForkSession(ctx, s.ID, client.ForkRequest{Count: 1, CreateRequest: small})
	if err != nil || len(fromSession.Sessions) != 1 || fromSession.Snapshot.SessionID != s.ID {
		t.Fatalf("ForkSession: %+v, %v", fromSession, err)
	}
	for want, ss := range map[string][]client.Session{"v1": fromSnap.Sessions, "v2": fromSession.Sessions} {
		for _, f := range ss {
			t.Cleanup(func() { destroy(c, f.ID) })
			out, err := c.ExecCollect(ctx, f.ID, client.ExecRequest{Cmd: "cat /home/user/mark"})
			if err != nil || string(out.Stdout) != want {
				t.Errorf("fork %s reads %q (%v), want %q", f.ID, out.Stdout, err, want)
			}
		}
	}
	child, err := c.Snapshot(ctx, fromSnap.Sessions[0].ID, 0)
	if err != nil || child.Parent != sn.ID {
		t.Fatalf("Snapshot of a fork: %+v, %v; want parent %s", child, err, sn.ID)
	}
	err = c.DeleteSnapshot(ctx, sn.ID, false)
	wantClass(t, "DeleteSnapshot of a snapshot sessions are built on", err, errdefs.ErrConflict)
	if err := c.DeleteSnapshot(ctx, sn.ID, true); err != nil {
		t.Fatalf("DeleteSnapshot --force: %v", err)
	}
	_, err = c.GetSnapshot(ctx, sn.ID)
	wantClass(t, "GetSnapshot after the delete", err, errdefs.ErrNotFound)
	_, err = c.GetSnapshot(ctx, child.ID)
	wantClass(t, "GetSnapshot of a snapshot built on a force-deleted one", err, errdefs.ErrNotFound)
	if err := c.DeleteSnapshot(ctx, exp.ID, false); err != nil {
		t.Fatalf("DeleteSnapshot: %v", err)
	}
	for _, f := range fromSnap.Sessions {
		if got, err := c.GetSession(ctx, f.ID); err != nil || got.State != "terminated" {
			t.Errorf("fork %s of the force-deleted snapshot: %+v, %v; want terminated", f.ID, got, err)
		}
	}
}

func testPools(t *testing.T, c *client.Client) {
	ctx := ctxFor(t, 3*time.Minute)
	ts, err := c.Templates(ctx)
	if err != nil || len(ts) == 0 || ts[0].Name != "base" {
		t.Fatalf("Templates: %+v, %v; want base first", ts, err)
	}
	p, err := c.SetPool(ctx, client.Pool{Template: "base", Size: 1, DiskMB: 256})
	if err != nil || p.Template != "base" || p.Size != 1 {
		t.Fatalf("SetPool: %+v, %v", p, err)
	}
	defer func() {
		if p, err := c.SetPool(ctxFor(t, time.Minute), client.Pool{Template: "base", Size: 0}); err != nil || p.Size != 0 {
			t.Errorf("SetPool to 0: %+v, %v", p, err)
		}
	}()
	for {
		pools, err := c.Pools(ctx)
		if err != nil {
			t.Fatalf("Pools: %v", err)
		}
		if len(pools) == 1 && pools[0].Ready == 1 && pools[0].DiskMB == 256 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the pool never got a ready member: %+v", pools)
		}
		time.Sleep(100 * time.Millisecond)
	}
	_, err = c.SetPool(ctx, client.Pool{Template: "no-such-template", Size: 1})
	wantClass(t, "SetPool of a missing template", err, errdefs.ErrInvalidArgument)
}

func testTenants(t *testing.T, c *client.Client, url string) {
	ctx := ctxFor(t, 3*time.Minute)
	tn, err := c.CreateTenant(ctx, "client-acme", client.TenantPolicy{MaxSessions: 1})
	if err != nil || tn.Name != "client-acme" || tn.Policy.MaxSessions != 1 {
		t.Fatalf("CreateTenant: %+v, %v", tn, err)
	}
	defer func() {
		if err := c.DeleteTenant(ctxFor(t, time.Minute), "client-acme", true); err != nil {
			t.Errorf("DeleteTenant --force: %v", err)
		}
	}()
	_, err = c.CreateTenant(ctx, "client-acme", client.TenantPolicy{})
	wantClass(t, "CreateTenant of an existing name", err, errdefs.ErrConflict)
	if all, err := c.Tenants(ctx); err != nil || len(all) < 2 {
		t.Fatalf("Tenants: %+v, %v; want default and client-acme", all, err)
	}
	if got, err := c.UpdateTenant(ctx, "client-acme", client.TenantPolicy{MaxSessions: 1, MaxPids: 256}, false); err != nil || got.Policy.MaxPids != 256 {
		t.Fatalf("UpdateTenant: %+v, %v", got, err)
	}
	if got, err := c.GetTenant(ctx, "client-acme"); err != nil || got.Policy.MaxPids != 256 {
		t.Fatalf("GetTenant: %+v, %v", got, err)
	}
	k, err := c.CreateKey(ctx, "client-acme", "ci", false)
	if err != nil || k.Secret == "" || k.Tenant != "client-acme" || k.Admin {
		t.Fatalf("CreateKey: %+v, %v", k, err)
	}
	if keys, err := c.Keys(ctx, "client-acme"); err != nil || len(keys) != 1 || keys[0].ID != k.ID {
		t.Fatalf("Keys: %+v, %v", keys, err)
	}

	// The tenant's own key: its policy applies, admin calls are refused.
	tc := client.New(url, k.Secret, nil)
	s, _, err := tc.CreateSession(ctx, client.CreateRequest{DiskMB: 256}, "")
	if err != nil {
		t.Fatalf("CreateSession with the tenant's key: %v", err)
	}
	// (DeleteTenant --force destroys it.)
	_, _, err = tc.CreateSession(ctx, client.CreateRequest{DiskMB: 256}, "")
	wantClass(t, "CreateSession past the tenant's MaxSessions", err, errdefs.ErrResourceExhausted)
	_, err = tc.Tenants(ctx)
	wantClass(t, "Tenants with a tenant's key", err, errdefs.ErrPermissionDenied)
	if got, err := tc.GetSession(ctx, s.ID); err != nil || got.ID != s.ID {
		t.Fatalf("GetSession with the tenant's key: %+v, %v", got, err)
	}
	// Sessions are scoped to their tenant, also against the default tenant's admin key.
	_, err = c.GetSession(ctx, s.ID)
	wantClass(t, "GetSession of another tenant's session", err, errdefs.ErrNotFound)

	// Audit: the tenant's records, one page and the export.
	list, err := c.Audit(ctx, client.AuditFilter{Tenant: "client-acme", Kind: "session.", Limit: 10})
	if err != nil || len(list.Records) == 0 || list.Records[0].Tenant != "client-acme" {
		t.Fatalf("Audit: %+v, %v", list, err)
	}
	var export bytes.Buffer
	if err := c.ExportAudit(ctx, client.AuditFilter{Tenant: "client-acme"}, &export); err != nil {
		t.Fatalf("ExportAudit: %v", err)
	}
	n := 0
	for sc := bufio.NewScanner(&export); sc.Scan(); n++ {
		var r client.AuditRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Tenant != "client-acme" {
			t.Fatalf("ExportAudit line %d: %q (%v)", n, sc.Text(), err)
		}
	}
	if n < len(list.Records) {
		t.Fatalf("ExportAudit gave %d records, the page alone %d", n, len(list.Records))
	}

	if err := c.RevokeKey(ctx, k.ID); err != nil {
		t.Fatalf("RevokeKey: %v", err)
	}
	_, err = tc.ListSessions(ctx, client.ListOptions{})
	wantClass(t, "a call with a revoked key", err, errdefs.ErrUnauthenticated)
}

func testErrors(t *testing.T, c *client.Client, url string) {
	ctx := ctxFor(t, 2*time.Minute)
	_, err := c.GetSession(ctx, "nosuchsession")
	wantClass(t, "GetSession of an unknown id", err, errdefs.ErrNotFound)
	_, _, err = c.CreateSession(ctx, client.CreateRequest{MemoryMB: -3}, "")
	wantClass(t, "CreateSession with a negative memory limit", err, errdefs.ErrInvalidArgument)
	var apiErr *client.Error
	if errors.As(err, &apiErr) && (apiErr.Field == "" || apiErr.Status != 400 || apiErr.RequestID == "") {
		t.Errorf("the problem names no field, status or request id: %+v", apiErr.Problem)
	}
	_, _, err = c.CreateSession(ctx, client.CreateRequest{Template: "no-such-template", DiskMB: 256}, "")
	wantClass(t, "CreateSession from an unknown template", err, errdefs.ErrInvalidArgument)
	_, err = client.New(url, "not-a-key", nil).Info(ctx)
	wantClass(t, "a call with an unknown key", err, errdefs.ErrUnauthenticated)
	err = c.DeleteTemplate(ctx, "no-such-template")
	wantClass(t, "DeleteTemplate of an unknown template", err, errdefs.ErrNotFound)
	_, err = c.ImportTemplate(ctx, "client-bad", "", strings.NewReader("not a tarball"), 13)
	wantClass(t, "ImportTemplate of a file that is no image", err, errdefs.ErrInvalidArgument)
	notImage := t.TempDir()
	if err := os.WriteFile(filepath.Join(notImage, "readme"), []byte("no index.json here"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = c.ImportTemplatePath(ctx, "client-bad", "", notImage)
	wantClass(t, "ImportTemplatePath of a directory that is no OCI layout", err, errdefs.ErrInvalidArgument)
	// The built-in ones only: base and its alias code-interpreter-v1.
	if ts, err := c.Templates(ctx); err != nil || len(ts) != 2 || ts[0].Name != "base" || ts[1].AliasOf != "base" {
		t.Errorf("after the refused imports the templates are %+v (%v), want base and its alias alone", ts, err)
	}

	s := newSession(t, c, client.CreateRequest{})
	if err := c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	_, err = c.ExecCollect(ctx, s.ID, client.ExecRequest{Cmd: "true"})
	wantClass(t, "ExecCollect in an ended session", err, errdefs.ErrTerminated)
	_, err = c.ExecCollect(ctx, "nosuchsession", client.ExecRequest{Cmd: "true"})
	wantClass(t, "ExecCollect in an unknown session", err, errdefs.ErrNotFound)
}
