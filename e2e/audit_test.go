package e2e

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestAuditTrailSurvivesRestart scripts a session through every kind of
// call, restarts the daemon, and proves the audit trail has every step, in
// order, with the tenant, the session, the request ids echoed to the
// caller, the Idempotency-Key, the exec's command hash, exit code and CPU
// time; and the JSON-lines export holds the same records. (That the table
// refuses changes is store's TestAuditAppendOnly.)
func TestAuditTrailSurvivesRestart(t *testing.T) {
	o := newOwnDaemon(t)
	ctx := ctxFor(t, 3*time.Minute)
	// (The tenant goes with the daemon's data directory.)
	tenant := "audited"
	if _, err := o.c.CreateTenant(ctx, tenant, client.TenantPolicy{}); err != nil {
		t.Fatal(err)
	}
	k, err := o.c.CreateKey(ctx, tenant, "", false)
	if err != nil {
		t.Fatal(err)
	}
	key := k.Secret
	call := func(method, path string, body any, header map[string]string, want int) (http.Header, []byte) {
		t.Helper()
		status, hdr, b := rawCallAt(t, o.d.URL, key, method, path, body, header)
		if status != want {
			t.Fatalf("%s %s: %d %s, want %d", method, path, status, b, want)
		}
		return hdr, b
	}
	hdr, b := call("POST", "/v1/sessions", map[string]any{}, map[string]string{
		"Idempotency-Key": "run-7f3a:step-12", "X-Request-Id": "req-create-1"}, 201)
	if hdr.Get("X-Request-Id") != "req-create-1" {
		t.Fatalf("request id not echoed: %q", hdr.Get("X-Request-Id"))
	}
	var s client.Session
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	id := s.ID
	sp := "/v1/sessions/" + id
	hdr, _ = call("POST", sp+"/exec", map[string]any{"cmd": "echo hi; exit 3"}, map[string]string{"Accept": "application/json"}, 200)
	execRequest := hdr.Get("X-Request-Id")
	call("PUT", sp+"/files/home/user/a.txt", "hello", nil, 201)
	call("GET", sp+"/files/home/user/a.txt", nil, nil, 200)
	call("POST", sp+"/fs/mkdir", map[string]any{"path": "/home/user/d"}, nil, 201)
	call("POST", sp+"/fs/move", map[string]any{"source": "/home/user/a.txt", "destination": "/home/user/d/a.txt"}, nil, 200)
	call("GET", sp+"/fs/stat?path=/home/user/d/a.txt", nil, nil, 200)
	call("GET", sp+"/fs/list?path=/home/user/d", nil, nil, 200)
	call("DELETE", sp+"/files/home/user/d/a.txt", nil, nil, 204)
	_, b = call("POST", sp+"/snapshot", map[string]any{}, nil, 201)
	var sn client.Snapshot
	json.Unmarshal(b, &sn)
	call("POST", sp+"/pause", nil, nil, 200)
	call("POST", sp+"/resume", nil, nil, 200)
	call("POST", sp+"/timeout", map[string]any{"timeout_s": 600}, nil, 200)
	call("GET", sp+"/files/nonexistent", nil, nil, 404)
	_, b = call("POST", "/v1/snapshots/"+sn.ID+"/fork", map[string]any{"count": 1}, nil, 201)
	var fork client.ForkResult
	json.Unmarshal(b, &fork)
	call("DELETE", "/v1/sessions/"+fork.Sessions[0].ID, nil, nil, 204)
	call("DELETE", sp, nil, nil, 204)

	o.restart(t, nil)
	c := client.New(o.d.URL, key, nil)

	list, err := c.Audit(ctx, client.AuditFilter{Session: id, Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	byKind := map[string]client.AuditRecord{}
	for _, r := range list.Records {
		if r.Tenant != tenant || r.Session != id {
			t.Errorf("record of another tenant or session: %+v", r)
		}
		kinds = append(kinds, r.Kind)
		byKind[r.Kind] = r
	}
	want := []string{"session.start", "session.create", "exec.start", "exec", "file.write", "file.read", "file.mkdir", "file.move",
		"file.stat", "file.list", "file.remove", "snapshot.create", "session.pause", "session.resume", "session.timeout",
		"file.read", "session.destroy", "session.end"}
	// session.end is written by the teardown, before the destroy request's
	// own record.
	wantAlt := append(slices.Clone(want[:len(want)-2]), "session.end", "session.destroy")
	if !slices.Equal(kinds, want) && !slices.Equal(kinds, wantAlt) {
		t.Fatalf("audit kinds after restart:\n got %v\nwant %v", kinds, want)
	}
	create := byKind["session.create"]
	if create.RequestID != "req-create-1" || create.IdempotencyKey != "run-7f3a:step-12" || create.KeyID == "" || create.Outcome != "ok" {
		t.Fatalf("create record: %+v", create)
	}
	ex := byKind["exec"]
	sum := sha256.Sum256([]byte("/bin/sh\x00-c\x00echo hi; exit 3"))
	if ex.RequestID != execRequest || ex.Detail["command_sha256"] != hex.EncodeToString(sum[:]) ||
		ex.Detail["exit_code"] != float64(3) || ex.Detail["cpu_ms"] == nil || ex.Detail["duration_ms"] == nil {
		t.Fatalf("exec record: %+v", ex)
	}
	if r := byKind["file.write"]; r.Detail["path"] != "/home/user/a.txt" || r.Detail["bytes"] != float64(5) {
		t.Fatalf("file.write record: %+v", r)
	}
	if r := byKind["snapshot.create"]; r.Detail["snapshot"] != sn.ID {
		t.Fatalf("snapshot record: %+v", r)
	}
	if r := list.Records[15]; r.Kind != "file.read" || r.Outcome != "error" || r.Detail["status"] != float64(404) {
		t.Fatalf("failed read record: %+v", r)
	}
	if r := byKind["session.end"]; r.Detail["reason"] != "deleted" {
		t.Fatalf("end record: %+v", r)
	}
	// The fork is recorded under the snapshot; its session has its own.
	forks, err := c.Audit(ctx, client.AuditFilter{Session: fork.Sessions[0].ID})
	if err != nil || len(forks.Records) < 3 {
		t.Fatalf("fork session's records: %+v %v", forks, err)
	}
	// The export holds the same records, as JSON lines.
	var buf bytes.Buffer
	if err := c.ExportAudit(ctx, client.AuditFilter{Session: id}, &buf); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(&buf)
	n := 0
	for sc.Scan() {
		var r client.AuditRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("export line %q: %v", sc.Text(), err)
		}
		if r.Seq != list.Records[n].Seq || r.Kind != list.Records[n].Kind {
			t.Fatalf("export line %d: %+v, listing has %+v", n, r, list.Records[n])
		}
		n++
	}
	if n != len(list.Records) {
		t.Fatalf("export has %d lines, listing %d records", n, len(list.Records))
	}
	// Filters: by kind prefix, by outcome.
	if l, err := c.Audit(ctx, client.AuditFilter{Session: id, Kind: "file."}); err != nil || len(l.Records) != 8 {
		t.Fatalf("kind file.: %d records, %v", len(l.Records), err)
	}
	if l, err := c.Audit(ctx, client.AuditFilter{Session: id, Outcome: "error"}); err != nil || len(l.Records) != 1 {
		t.Fatalf("outcome error: %+v %v", l, err)
	}
	// The install's key can be revoked by another admin key, and the
	// daemon still starts (it keeps the file's key revoked).
	admin, err := o.c.CreateKey(ctx, "default", "second admin", true)
	if err != nil {
		t.Fatal(err)
	}
	ac := client.New(o.d.URL, admin.Secret, nil)
	keys, err := ac.Keys(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if k.ID != admin.ID {
			if err := ac.RevokeKey(ctx, k.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := o.c.Tenants(ctx); err == nil {
		t.Fatal("the revoked install key still works")
	}
	o.restart(t, nil)
	if _, err := client.New(o.d.URL, admin.Secret, nil).Tenants(ctx); err != nil {
		t.Fatalf("the second admin key after a restart: %v", err)
	}
	if _, err := o.c.Tenants(ctx); err == nil {
		t.Fatal("the revoked install key works again after a restart")
	}
	o.c = client.New(o.d.URL, admin.Secret, nil) // for the test's cleanup
}
