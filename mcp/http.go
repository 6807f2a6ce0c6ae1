package mcp

import (
	"context"
	"net/http"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/forkbox/forkbox/api/access"
	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/tenancy"
)

// inProcessURL is the base URL of the clients NewHTTPHandler makes: their
// requests never leave the process, so it names no host (no handler of
// the API reads the request's host).
const inProcessURL = "http://forkbox.in-process"

// NewHTTPHandler returns the daemon's MCP endpoint: MCP's streamable
// HTTP transport in stateless mode (each POST is a whole exchange, so no
// MCP session outlives its request or can be taken over with another
// key; GET and DELETE answer 405, which clients take as "no
// server-initiated stream"; a request body is at most the SDK's 4 MiB; a
// tool call ends when its request is cancelled). It must be mounted
// behind the API's authentication: the
// request's API key (access.Secret) and caller (tenancy) are what it
// serves with.
//
// Each request gets a server whose client carries the caller's API key
// and whose HTTP transport hands every request straight to api, the
// daemon's own API handler, in the process (InProcess): a tool call is a
// REST call authenticated, authorized, admitted by the tenant's policy
// and audited like any other, without a second connection through the
// daemon's listener (which may be bound to an address the daemon cannot
// dial, or closing during a shutdown), and without a second copy of any
// rule. The REST calls carry the MCP request's id (X-Request-Id), so the
// audit records of a tool call's REST calls share it with the call's own
// record. onCall, when set, gets each finished tool call with the
// caller in its context (the daemon records it as an audit record).
func NewHTTPHandler(api http.Handler, onCall func(context.Context, Call)) http.Handler {
	h := sdk.NewStreamableHTTPHandler(func(r *http.Request) *sdk.Server {
		// The SDK asks twice per request (protocol versions, then the
		// exchange): the request's server is made once.
		sl, _ := r.Context().Value(serverSlot{}).(*slot)
		if sl != nil && sl.srv != nil {
			return sl.srv
		}
		caller, _ := tenancy.From(r.Context())
		hc := &http.Client{Transport: InProcess(api, caller.RequestID)}
		c := client.New(inProcessURL, access.Secret(r, false), hc)
		var opts Options
		if onCall != nil {
			opts.OnCall = func(ctx context.Context, call Call) {
				// The tool's context is the SDK's; the caller is the request's.
				onCall(tenancy.With(ctx, caller), call)
			}
		}
		srv := NewServer(c, opts)
		if sl != nil {
			sl.srv = srv
		}
		return srv
	}, &sdk.StreamableHTTPOptions{Stateless: true, PropagateRequestCancellation: true})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), serverSlot{}, &slot{})))
	})
}

// serverSlot is the context key of a request's slot.
type serverSlot struct{}

// slot holds the server made for one request (the SDK's calls for one
// request run one after the other).
type slot struct{ srv *sdk.Server }
