package e2b

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// Signed file URLs: the SDK's uploadUrl() and downloadUrl() sign
// "PATH:OPERATION:USER:TOKEN[:EXPIRATION]" with the sandbox's envd access
// token (SDK src/sandbox/signature.ts: "v1_" + base64 of its sha256, the
// padding cut; operation "write" or "read"; user "" when none was named;
// expiration in Unix seconds) and send it as ?signature= and
// ?signature_expiration= on envd's /files, which accepts it in place of
// X-Access-Token (INFRA packages/envd/internal/api/auth.go). With
// E2B_SANDBOX_URL the link names no sandbox (no E2b-Sandbox-Id header can
// travel in a URL), so the daemon finds the one whose token made the
// signature. forkbox adds: each signature opens one request (a second use
// is 401), remembered until it expires.

// signatureVersion prefixes every signature the SDK makes.
const signatureVersion = "v1_"

// maxSignedPath bounds a signed link's path and username, in bytes (a
// Linux path is at most 4096 bytes).
const maxSignedPath = 4096

// maxUsedSignatures bounds the signatures of one tenant remembered as used.
const maxUsedSignatures = 100_000

// unexpiringSignatureTTL is how long a signature without an expiration is
// remembered as used: longer than a sandbox (its token) can live.
const unexpiringSignatureTTL = 72 * time.Hour

// signedFileRequest reports whether r is a signed /files link: a GET or
// POST /files with a signature and no access token.
func signedFileRequest(r *http.Request) bool {
	return r.URL.Path == "/files" && r.Header.Get(accessTokenHeader) == "" && r.URL.Query().Has("signature")
}

// fileSignature is the signature the SDK makes for path, operation, user
// and the envd token, with expiration (Unix seconds) when it is not "".
func fileSignature(path, operation, user, token, expiration string) string {
	raw := path + ":" + operation + ":" + user + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return signatureVersion + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

// signedParts reads a signed request's operation and parameters; an
// expired or malformed signature is ErrUnauthenticated.
func signedParts(r *http.Request, now time.Time) (op, sig, exp string, expires time.Time, err error) {
	switch r.Method {
	case http.MethodGet:
		op = "read"
	case http.MethodPost:
		op = "write"
	default:
		return "", "", "", time.Time{}, errdefs.Newf(errdefs.ErrInvalidArgument, "a signed /files URL is for GET (read) or POST (write)")
	}
	q := r.URL.Query()
	if len(q.Get("path")) > maxSignedPath || len(q.Get("username")) > maxSignedPath {
		// Each unnamed link is checked against every live sandbox: a
		// long path would make each anonymous request costly.
		return "", "", "", time.Time{}, errdefs.InvalidField("path", "a signed /files URL's path and username are at most %d bytes", maxSignedPath)
	}
	if q.Get("path") == "" {
		// Signed without a path, a write would let the link's holder
		// write any file (a multipart part's own name): forkbox's links
		// name their file.
		return "", "", "", time.Time{}, errdefs.InvalidField("path", "a signed /files URL must name its file (uploadUrl(path), downloadUrl(path))")
	}
	sig, exp = q.Get("signature"), q.Get("signature_expiration")
	if !strings.HasPrefix(sig, signatureVersion) {
		return "", "", "", time.Time{}, errdefs.Newf(errdefs.ErrUnauthenticated, "the signature is not a v1 signature")
	}
	expires = now.Add(unexpiringSignatureTTL)
	if exp != "" {
		sec, perr := strconv.ParseInt(exp, 10, 64)
		if perr != nil {
			return "", "", "", time.Time{}, errdefs.Newf(errdefs.ErrUnauthenticated, "signature_expiration must be Unix seconds")
		}
		expires = time.Unix(sec, 0)
		if !now.Before(expires) {
			return "", "", "", time.Time{}, errdefs.Newf(errdefs.ErrUnauthenticated, "the signed URL expired at %s", expires.UTC().Format(time.RFC3339))
		}
	}
	return op, sig, exp, expires, nil
}

// signedBy reports whether r's signature was made with rec's envd token
// (constant-time).
func signedBy(r *http.Request, rec *node.Session, op, sig, exp string) bool {
	if rec.EnvdToken == "" {
		return false
	}
	q := r.URL.Query()
	want := fileSignature(q.Get("path"), op, q.Get("username"), rec.EnvdToken, exp)
	return subtle.ConstantTimeCompare([]byte(want), []byte(sig)) == 1
}

// checkSignature checks a signed /files request for sandbox id and claims
// its signature (single use). ErrUnauthenticated for a wrong, expired or
// used one; the session's errors as CheckEnvdToken gives them.
func (h *Handler) checkSignature(r *http.Request, id string) (*node.Session, error) {
	op, sig, exp, expires, err := signedParts(r, time.Now())
	if err != nil {
		return nil, err
	}
	rec, err := h.mgr.Get(r.Context(), id)
	if err != nil {
		return nil, err
	}
	if rec.State == node.StateTerminated {
		return nil, errdefs.Newf(errdefs.ErrTerminated, "sandbox %s ended (%s)", id, rec.Reason)
	}
	if !signedBy(r, rec, op, sig, exp) {
		return nil, errdefs.Newf(errdefs.ErrUnauthenticated, "the signature does not match sandbox %s's %s of this path and user", id, op)
	}
	if err := h.used.claim(rec.Tenant, sig, expires); err != nil {
		return nil, err
	}
	return rec, nil
}

// serveSignedFile serves a signed /files link that names no sandbox (the
// SDK built it on E2B_SANDBOX_URL): the sandbox is the live one whose
// envd token made the signature; none is 401.
func (h *Handler) serveSignedFile(w http.ResponseWriter, r *http.Request) {
	op, sig, exp, expires, err := signedParts(r, time.Now())
	if err != nil {
		h.fail(w, r, err)
		return
	}
	// Every tenant's: the request has no key, and the signature is what
	// proves its right to one sandbox.
	recs, err := h.mgr.List(r.Context(), node.SessionFilter{States: []node.State{node.StateRunning, node.StatePaused}})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var found *node.Session
	for _, rec := range recs {
		if signedBy(r, rec, op, sig, exp) {
			found = rec
			break
		}
	}
	if found == nil {
		writeError(w, http.StatusUnauthorized, "the signature matches no running sandbox's "+op+" of this path and user")
		return
	}
	if err := h.used.claim(found.Tenant, sig, expires); err != nil {
		h.fail(w, r, err)
		return
	}
	dropSignedUser(r)
	h.proxyEnvd(w, r, found)
}

// dropSignedUser removes what could name a user other than the one a
// signed link was made for: the agent takes an empty username from
// "Authorization: Basic", which the signature does not cover.
func dropSignedUser(r *http.Request) { r.Header.Del("Authorization") }

// usedSignatures remembers the signatures that opened a request, each
// until it expires, per tenant (bounded: maxUsedSignatures a tenant), so
// that one tenant using links without end refuses only its own.
type usedSignatures struct {
	mu   sync.Mutex
	seen map[string]map[string]time.Time // tenant → signature → until
}

func newUsedSignatures() *usedSignatures {
	return &usedSignatures{seen: map[string]map[string]time.Time{}}
}

// claim records sig (valid until expires) as used by tenant;
// ErrUnauthenticated when it was used already, ErrResourceExhausted when
// maxUsedSignatures unexpired ones of tenant are remembered.
func (u *usedSignatures) claim(tenant, sig string, expires time.Time) error {
	now := time.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	seen := u.seen[tenant]
	if seen == nil {
		seen = map[string]time.Time{}
		u.seen[tenant] = seen
	}
	if until, ok := seen[sig]; ok && now.Before(until) {
		return errdefs.Newf(errdefs.ErrUnauthenticated, "this signed URL was used already: each one opens one request")
	}
	if len(seen) >= maxUsedSignatures {
		for s, until := range seen {
			if !now.Before(until) {
				delete(seen, s)
			}
		}
		if len(seen) >= maxUsedSignatures {
			return errdefs.Newf(errdefs.ErrResourceExhausted, "too many of this tenant's signed URLs in use (%d); try again later", maxUsedSignatures)
		}
	}
	seen[sig] = expires
	return nil
}
