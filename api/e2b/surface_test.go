package e2b

import (
	"errors"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// TestFileSignatureIsTheSDKs pins fileSignature to what the e2b SDK 2.51's
// getSignature returns for the same inputs (vectors printed by the SDK).
func TestFileSignatureIsTheSDKs(t *testing.T) {
	if got, want := fileSignature("/home/user/a b.txt", "read", "", "tok123", ""),
		"v1_oBWcB6Y7ynINkNCbWfy+5Q9m6wAVgyfQl9kI+laMHAA"; got != want {
		t.Errorf("without expiration: %s, want %s", got, want)
	}
	if got, want := fileSignature("x.txt", "write", "root", "tok123", "1796231581"),
		"v1_QQIxunS8Dajxi2IvkyavnsFwpvOP1+CmhXVWYoZASxs"; got != want {
		t.Errorf("with expiration: %s, want %s", got, want)
	}
}

// TestSignedRequestChecks proves a signature opens only its own path,
// operation and user, and only before it expires.
func TestSignedRequestChecks(t *testing.T) {
	rec := &node.Session{ID: "s1", EnvdToken: "tok123"}
	now := time.Unix(1_800_000_000, 0)
	exp := "1800000060"
	sig := fileSignature("/a.txt", "read", "", rec.EnvdToken, exp)
	req := func(method string, q url.Values) (string, string, string, bool, error) {
		r := httptest.NewRequest(method, "/files?"+q.Encode(), nil)
		op, s, e, _, err := signedParts(r, now)
		if err != nil {
			return "", "", "", false, err
		}
		return op, s, e, signedBy(r, rec, op, s, e), nil
	}
	good := url.Values{"path": {"/a.txt"}, "signature": {sig}, "signature_expiration": {exp}}
	if _, _, _, ok, err := req("GET", good); err != nil || !ok {
		t.Fatalf("the SDK's own request: ok %v, %v", ok, err)
	}
	if _, _, _, ok, _ := req("POST", good); ok {
		t.Error("a read signature opens a write")
	}
	for name, change := range map[string]func(url.Values){
		"another path":       func(q url.Values) { q.Set("path", "/etc/passwd") },
		"another user":       func(q url.Values) { q.Set("username", "root") },
		"a later expiration": func(q url.Values) { q.Set("signature_expiration", "1800000999") },
	} {
		q := url.Values{}
		for k, v := range good {
			q[k] = v
		}
		change(q)
		if _, _, _, ok, _ := req("GET", q); ok {
			t.Errorf("%s is accepted", name)
		}
	}
	past := url.Values{"path": {"/a.txt"}, "signature": {sig}, "signature_expiration": {"1799999999"}}
	if _, _, _, _, err := req("GET", past); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("an expired signature: %v, want unauthenticated", err)
	}
	if _, _, _, _, err := req("GET", url.Values{"path": {"/a.txt"}, "signature": {"v2_x"}}); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("another version: %v", err)
	}
	// A link signed without a path would let its holder write any file.
	noPath := fileSignature("", "write", "", rec.EnvdToken, "")
	if _, _, _, _, err := req("POST", url.Values{"signature": {noPath}}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a link without a path: %v, want invalid argument", err)
	}
	if _, _, _, _, err := req("PUT", good); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("PUT: %v, want invalid argument", err)
	}
	if signedBy(httptest.NewRequest("GET", "/files?path=%2Fa.txt", nil), &node.Session{}, "read", sig, exp) {
		t.Error("a session without a token accepts a signature")
	}
}

// TestSignatureOpensOneRequest proves each signature is claimed once,
// while it is valid.
func TestSignatureOpensOneRequest(t *testing.T) {
	u := newUsedSignatures()
	later := time.Now().Add(time.Minute)
	if err := u.claim("t", "a", later); err != nil {
		t.Fatal(err)
	}
	if err := u.claim("t", "a", later); !errors.Is(err, errdefs.ErrUnauthenticated) {
		t.Fatalf("second claim: %v, want unauthenticated", err)
	}
	if err := u.claim("t", "b", later); err != nil {
		t.Fatalf("another signature: %v", err)
	}
	// An entry whose time is over is pruned when the table is full.
	u.seen = map[string]map[string]time.Time{"t": {}}
	for i := 0; i < maxUsedSignatures; i++ {
		u.seen["t"][strconv.Itoa(i)] = time.Now().Add(-time.Second)
	}
	if err := u.claim("t", "c", later); err != nil || len(u.seen["t"]) != 1 {
		t.Fatalf("a full table of expired entries: %v, %d left", err, len(u.seen["t"]))
	}
	// A tenant's full table of live entries refuses only that tenant.
	for i := 0; i < maxUsedSignatures; i++ {
		u.seen["t"][strconv.Itoa(i)] = later
	}
	if err := u.claim("t", "d", later); !errors.Is(err, errdefs.ErrResourceExhausted) {
		t.Fatalf("a full table: %v, want resource exhausted", err)
	}
	if err := u.claim("other", "d", later); err != nil {
		t.Fatalf("another tenant beside a full table: %v", err)
	}
}

// TestLogLines proves log entries become the CLI's JSON lines and the
// v2 entries' levels.
func TestLogLines(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	e := entryOf(node.LogLine{Time: at, Level: "WARNING", Message: "m", Fields: map[string]string{"pid": "7", "logger": "process"}})
	if e.Level != "info" || e.Fields["pid"] != "7" {
		t.Fatalf("entry %+v", e)
	}
	l := lineOf(entryOf(node.LogLine{Time: at, Level: "warn", Message: "hello"}))
	if l.Line != `{"level":"warn","logger":"agent","message":"hello"}` || !l.Timestamp.Equal(at) {
		t.Fatalf("line %+v", l)
	}
}

// TestCPUPercent proves the share of the quota between two samples.
func TestCPUPercent(t *testing.T) {
	rec := &node.Session{CPU: 0.5}
	t0 := time.Unix(100, 0)
	a, b := node.UsageSample{Time: t0, CPUSeconds: 1}, node.UsageSample{Time: t0.Add(10 * time.Second), CPUSeconds: 3}
	if got := cpuPercent(rec, a, b); got != 40 {
		t.Errorf("2 CPU-s in 10 s of half a core: %v%%, want 40", got)
	}
	if got := cpuPercent(rec, b, a); got != 0 {
		t.Errorf("backwards: %v", got)
	}
	if got := cpuPercent(rec, a, node.UsageSample{Time: b.Time, CPUSeconds: 100}); got != 100 {
		t.Errorf("capped: %v", got)
	}
}
