package api

import (
	"context"

	"github.com/forkbox/forkbox/api/portproxy"
	"github.com/forkbox/forkbox/audit"
	"github.com/forkbox/forkbox/build"
	"github.com/forkbox/forkbox/metrics"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/template"
)

// The REST handlers, one type per resource, each holding only what its
// handlers use. Server routes to them (server.go); they share the edge
// (edge.go, problem.go, json.go).

// sessionAPI serves sessions: create, list, get, destroy, timeout, usage,
// egress, pause and resume (sessions.go).
type sessionAPI struct {
	edge
	mgr node.Node
	// ended, when set, is asked about a session this host does not hold
	// (Server.SetEnded).
	ended func(ctx context.Context, id string) error
	// self is this host's fleet id, for a create that names its host.
	self *hostSelf
	// migrate, when set, serves migrations (Server.SetMigrator).
	migrate Migrator
}

// hostSelf is this host's fleet id as the handlers that check a pinned
// host read it (Server.SetHosts sets it; "" until then).
type hostSelf struct{ id func() string }

func (s *hostSelf) get() string {
	if s == nil || s.id == nil {
		return ""
	}
	return s.id()
}

// snapshotAPI serves snapshots, forks and warm pools (snapshots.go).
type snapshotAPI struct {
	edge
	mgr  node.Node
	self *hostSelf
}

// execAPI serves exec and processes (exec.go): it records each command
// before it runs and observes exec times.
type execAPI struct {
	edge
	mgr     node.Node
	audit   *audit.Recorder
	metrics *metrics.Set
}

// codeAPI serves a session's code-execution service (code.go): it records
// each cell before it runs.
type codeAPI struct {
	edge
	mgr   node.Node
	audit *audit.Recorder
}

// fileAPI serves a session's files and directories (files.go).
type fileAPI struct {
	edge
	mgr node.Node
}

// templateAPI serves the template catalog (templates.go). The node holds
// a tenant's template quota during an import; the store has the template
// records and tenants; spoolDir receives uploaded image tarballs before
// import.
type templateAPI struct {
	edge
	mgr      node.Node
	store    *store.Store
	catalog  *template.Catalog
	builder  *build.Builder
	spoolDir string
}

// tenantAPI serves tenants and API keys (tenants.go, admin only).
type tenantAPI struct {
	edge
	mgr     node.Node
	store   *store.Store
	catalog *template.Catalog
}

// auditAPI serves the audit log from the store, or the fleet's
// (audit.go).
type auditAPI struct {
	edge
	store *store.Store
	// fleet, when set, reads every host's records (SetAuditReader).
	fleet AuditReader
}

// hostAPI serves the host's info and its metrics (info.go).
type hostAPI struct {
	edge
	mgr     node.Node
	metrics *metrics.Set
}

// handlers is one of each handler type, as routes wires them.
type handlers struct {
	sessions  *sessionAPI
	snapshots *snapshotAPI
	exec      *execAPI
	code      *codeAPI
	files     *fileAPI
	templates *templateAPI
	tenants   *tenantAPI
	audit     *auditAPI
	host      *hostAPI
	ports     *portAPI
	secrets   *secretAPI
	volumes   *volumeAPI
}

// newHandlers builds the handlers over the given node, store, catalog,
// spool directory, audit recorder and metrics (see New), all sharing e.
func newHandlers(e edge, mgr node.Node, st *store.Store, catalog *template.Catalog, spoolDir string,
	rec *audit.Recorder, ms *metrics.Set) handlers {
	self := &hostSelf{}
	return handlers{
		sessions:  &sessionAPI{edge: e, mgr: mgr, self: self},
		snapshots: &snapshotAPI{edge: e, mgr: mgr, self: self},
		exec:      &execAPI{edge: e, mgr: mgr, audit: rec, metrics: ms},
		code:      &codeAPI{edge: e, mgr: mgr, audit: rec},
		files:     &fileAPI{edge: e, mgr: mgr},
		templates: &templateAPI{edge: e, mgr: mgr, store: st, catalog: catalog, builder: build.New(mgr, catalog), spoolDir: spoolDir},
		tenants:   &tenantAPI{edge: e, mgr: mgr, store: st, catalog: catalog},
		audit:     &auditAPI{edge: e, store: st},
		host:      &hostAPI{edge: e, mgr: mgr, metrics: ms},
		secrets:   &secretAPI{edge: e},
		volumes:   &volumeAPI{edge: e, mgr: mgr},
		ports:     &portAPI{edge: e, mgr: mgr, proxy: &portproxy.Proxy{Ports: mgr, Audit: rec, Log: e.log}},
	}
}
