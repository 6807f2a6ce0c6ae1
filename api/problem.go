package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"github.com/forkbox/forkbox/build"
	"net/http"
	"sort"
	"strings"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/internal/httpjson"
	"github.com/forkbox/forkbox/internal/inflight"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/template"

	"github.com/forkbox/forkbox/errdefs"
)

// problemClass is one row of the error-class table.
type problemClass struct {
	class  error
	status int
	slug   string
	title  string
	about  string
}

// problemClasses maps every errdefs class to its HTTP status and problem
// type, once, here at the edge.
var problemClasses = []problemClass{
	{errdefs.ErrInvalidArgument, http.StatusBadRequest, "invalid-argument", "Invalid argument",
		"The request is malformed or a field is out of range; `field` names it."},
	{errdefs.ErrUnauthenticated, http.StatusUnauthorized, "unauthenticated", "Unauthenticated",
		"No API key, or an unknown one. Send it as `Authorization: Bearer <key>` or `X-API-Key: <key>`."},
	{errdefs.ErrPermissionDenied, http.StatusForbidden, "permission-denied", "Permission denied",
		"The key is valid but may not do this."},
	{errdefs.ErrNotFound, http.StatusNotFound, "not-found", "Not found",
		"The session, process, file or template does not exist."},
	{errdefs.ErrConflict, http.StatusConflict, "conflict", "Conflict",
		"The resource exists already or its state forbids the action (for example a session still being created)."},
	{errdefs.ErrTerminated, http.StatusGone, "session-terminated", "Session terminated",
		"The session has ended; `detail` gives the reason (deleted, timeout or error)."},
	{errdefs.ErrResourceExhausted, http.StatusTooManyRequests, "resource-exhausted", "Resource exhausted",
		"A quota or limit was reached."},
	{errdefs.ErrInsufficientStorage, http.StatusInsufficientStorage, "insufficient-storage", "Insufficient storage",
		"The sandbox's disk is full."},
	{errdefs.ErrUnavailable, http.StatusServiceUnavailable, "unavailable", "Unavailable",
		"The host or the sandbox's agent cannot serve the request now; retry later."},
	{errdefs.ErrInternal, http.StatusInternalServerError, "internal", "Internal error",
		"forkbox failed unexpectedly; the daemon log has the request id."},
}

// typedProblems are the problem types more precise than their class
// (errdefs.TypedError): the system design's section 4.3, the daily CPU
// budget and the tenant quotas, an agent's own failure (502), and bodies
// refused before decoding (413, 415).
var typedProblems = []problemClass{
	{errdefs.ErrInvalidArgument, http.StatusBadRequest, node.ProblemImageNotApproved, "Image not approved",
		"The template (or the snapshot's template) is not on the tenant's approved list."},
	{errdefs.ErrPermissionDenied, http.StatusForbidden, node.ProblemEgressNotAllowed, "Egress not allowed",
		"A requested egress destination is outside the tenant's egress policy; `field` names it."},
	{errdefs.ErrResourceExhausted, http.StatusTooManyRequests, node.ProblemTenantConcurrency, "Tenant concurrency exceeded",
		"The tenant is at its limit of concurrent sessions; retry after Retry-After seconds, or end one."},
	{errdefs.ErrResourceExhausted, http.StatusTooManyRequests, node.ProblemCPUBudgetExhausted, "CPU budget exhausted",
		"The tenant used its CPU-seconds for the day (UTC); Retry-After says when the next day begins."},
	{errdefs.ErrPermissionDenied, http.StatusForbidden, node.ProblemTenantSuspended, "Tenant suspended",
		"The abuse detector flagged the tenant and its policy suspends it then; an admin reviews and clears the flag."},
	{errdefs.ErrResourceExhausted, http.StatusTooManyRequests, node.ProblemTenantQuota, "Tenant quota exceeded",
		"The tenant keeps as many snapshots or imported templates as its policy allows; delete one first."},
	{errdefs.ErrUnavailable, http.StatusServiceUnavailable, node.ProblemCapacity, "Capacity unavailable",
		"The host runs as many sessions (or as much memory) as it may; retry after Retry-After seconds."},
	{errdefs.ErrResourceExhausted, http.StatusTooManyRequests, inflight.Problem, "Exec requests in flight exceeded",
		"The tenant (or the host) has as many exec and stdin request bytes in flight as it may (serve --max-exec-inflight-tenant-mb, " +
			"--max-exec-inflight-mb); nothing of this request was run. Retry after Retry-After seconds."},
	{errdefs.ErrUnavailable, http.StatusServiceUnavailable, node.ProblemExecStreamCut, "Exec stream cut",
		"A memory snapshot of the session cut the command's output stream; the command keeps running. " +
			"Re-attach (GET /v1/sessions/{id}/processes/{pid}/stream) for its output from then on and its exit; " +
			"do not retry the exec, which would run the command again."},
	{errdefs.ErrInternal, http.StatusBadGateway, node.ProblemAgentFailed, "Agent failed",
		"The sandbox's agent could not do this (for example an I/O error on a file in the sandbox); `detail` has its message. The same call fails the same way again."},
	{errdefs.ErrUnavailable, http.StatusBadGateway, node.ProblemPortNotListening, "Port not listening",
		"Nothing listens on that port inside the sandbox (on 127.0.0.1 or ::1); start the server in the sandbox first."},
	{errdefs.ErrInvalidArgument, http.StatusRequestEntityTooLarge, httpjson.ProblemContentTooLarge, "Content too large",
		"The request body is larger than the endpoint accepts; `detail` says the limit in bytes."},
	{errdefs.ErrInvalidArgument, http.StatusUnsupportedMediaType, httpjson.ProblemUnsupportedMediaType, "Unsupported media type",
		"The body's Content-Type is not JSON: send `Content-Type: application/json` (a body without Content-Type is read as JSON)."},
	{errdefs.ErrUnavailable, http.StatusGatewayTimeout, template.ProblemRegistryUnreachable, "Registry unreachable",
		"The image's registry did not answer a pull (connection refused, a name that does not resolve, a timeout); `detail` names the image. Nothing was kept."},
	{errdefs.ErrUnavailable, http.StatusBadGateway, template.ProblemRegistryError, "Registry error",
		"The image's registry failed a pull, limited its rate, or served content that does not match its digest; `detail` says which. Nothing of the image was kept."},
	{errdefs.ErrPermissionDenied, http.StatusForbidden, template.ProblemRegistryDenied, "Registry denied",
		"The image's registry refused the pull's credentials, or wants some: give them (`auth` in the request; the CLI's --username and --password-stdin or a docker config)."},
	{errdefs.ErrPermissionDenied, http.StatusForbidden, template.ProblemRegistryAddress, "Registry address not allowed",
		"The registry is at a private, loopback or link-local address, which a tenant's pulls may not reach; the daemon's --private-registry allows one."},
	{errdefs.ErrResourceExhausted, http.StatusRequestEntityTooLarge, template.ProblemTemplateTooLarge, "Template too large",
		"The image (its compressed layers, or the files they unpack to) is larger than the tenant's max_template_mb or the host's limit; `detail` names the limit."},
	{errdefs.ErrConflict, http.StatusConflict, node.ProblemMergeConflict, "Merge conflict",
		"Both sides of a merge changed these paths in ways that do not merge (binary files, overlapping lines, a change against a deletion); " +
			"`paths` lists every one and nothing was changed. Retry with on_conflict \"ours\" or \"theirs\", or merge fewer paths."},
	{errdefs.ErrInvalidArgument, http.StatusUnprocessableEntity, build.ProblemStepFailed, "Build step failed",
		"A RUN step of the build exited non-zero; `detail` names the step, its line, its exit code and its last output. Nothing was registered; the steps before it stay cached."},
	{errdefs.ErrInvalidArgument, http.StatusUnprocessableEntity, node.ProblemReadyCheckFailed, "Ready check failed",
		"The template's ready check did not exit 0 within its timeout (the template's ready_timeout_s, default 30 s) after its start command was started; " +
			"`detail` names the check, its tries, its last exit code and output. The session was destroyed."},
	{errdefs.ErrUnavailable, http.StatusServiceUnavailable, node.ProblemSandboxNotReady, "Sandbox not ready",
		"The sandbox started but its agent did not answer within the readiness wait (which grows with the host's load; " +
			"`forkbox serve --agent-ready-timeout`); the host is probably overloaded: retry after Retry-After seconds."},
}

// problemPath is the path prefix of problem type URIs.
const problemPath = "/problems/"

// ProblemFor builds the problem for err: the class decides status and type,
// err's message is the detail. Errors of no class are internal errors whose
// message is not shown.
func ProblemFor(err error) v1.Problem {
	class := errdefs.Class(err)
	var ce *node.ConflictError
	if errors.As(err, &ce) {
		return v1.Problem{Type: problemPath + node.ProblemMergeConflict, Title: "Merge conflict", Status: http.StatusConflict,
			Detail: ce.Error(), Paths: ce.Paths}
	}
	var te *errdefs.TypedError
	if errors.As(err, &te) {
		for _, pc := range typedProblems {
			if pc.slug == te.Type && pc.class == class {
				return v1.Problem{Type: problemPath + pc.slug, Title: pc.title, Status: pc.status, Field: te.Field,
					Detail: te.Msg}
			}
		}
	}
	for _, pc := range problemClasses {
		if pc.class != class {
			continue
		}
		p := v1.Problem{Type: problemPath + pc.slug, Title: pc.title, Status: pc.status, Field: errdefs.Field(err)}
		if class != errdefs.ErrInternal {
			p.Detail = detailOf(err, class)
		}
		return p
	}
	panic("unreachable: errdefs.Class returned an unknown class")
}

// detailOf is err's message without the trailing ": <class>" text.
func detailOf(err error, class error) string {
	msg := err.Error()
	var fe *errdefs.FieldError
	if errors.As(err, &fe) {
		return fe.Error()
	}
	return strings.TrimSuffix(msg, ": "+class.Error())
}

// writeProblem writes p as application/problem+json.
func writeProblem(w http.ResponseWriter, r *http.Request, p v1.Problem) {
	p.Instance = r.URL.Path
	p.RequestID = w.Header().Get(requestIDHeader)
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// handleProblemDoc serves the description of a problem type (no auth).
func handleProblemDoc(w http.ResponseWriter, r *http.Request) {
	slug := r.PathValue("slug")
	for _, pc := range append(problemClasses, typedProblems...) {
		if pc.slug == slug {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprintf(w, "%s (HTTP %d)\n\n%s\n", pc.title, pc.status, pc.about)
			return
		}
	}
	writeProblem(w, r, v1.Problem{Type: problemPath + "not-found", Title: "Not found", Status: http.StatusNotFound,
		Detail: "no such problem type: " + slug})
}

// ProblemTypes lists the problem type URIs this API can return, sorted.
func ProblemTypes() []string {
	var out []string
	for _, pc := range append(problemClasses, typedProblems...) {
		out = append(out, problemPath+pc.slug)
	}
	sort.Strings(out)
	return out
}
