package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/forkbox/forkbox/client"
)

// GroupReady is the rows of a template with a start command and a ready
// check (an HTTP server on loopback and a HEALTHCHECK that fetches it),
// built once in the gVisor tier: a create that starts the server and
// awaits the check beside one that restores the template's warm snapshot
// (the server already running), each until an exec in the session got
// the page.
const GroupReady = "ready"

// The ready rows' operations.
const (
	// OpReadyCold is a gVisor create of the template that starts its
	// start command and awaits its ready check (the create names an
	// environment, which a warm snapshot cannot give), then one fetch.
	OpReadyCold = "gVisor: create of a started-server template (start + ready check) until it answers"
	// OpReadyWarm is the same create restoring the template's warm
	// snapshot.
	OpReadyWarm = "gVisor: create of a started-server template from its warm snapshot until it answers"
)

// readyBenchDockerfile is the ready rows' template: a Python HTTP server
// on 127.0.0.1:8000 and a ready check that fetches it.
const readyBenchDockerfile = `FROM base
CMD ["/bin/sh", "-c", "exec python3 -m http.server 8000 --bind 127.0.0.1 --directory /tmp"]
HEALTHCHECK CMD curl -fs http://127.0.0.1:8000/ > /dev/null
`

// measureReady measures the ready rows (GroupReady) when the daemon has
// the gvisor driver: the template is built once (untimed, deleted at the
// end with its warm snapshot); each round times both creates, each
// until `curl` in the session got the page, and destroys the sessions
// (untimed). There is no peer: no other tool here starts a template's
// server in a sandbox and waits for it.
func (e *env) measureReady(ctx context.Context) []Result {
	f := e.fb
	ops := []string{OpReadyCold, OpReadyWarm}
	if !f.hasDriver(ctx, driverGVisor) {
		return failOps(ops, SystemForkbox, errors.New("the daemon has no gvisor driver (install runsc from bookworm-backports)"))
	}
	name := "bench-ready-" + f.runID
	res, err := f.c.BuildTemplate(ctx, name, client.BuildRequest{Dockerfile: readyBenchDockerfile, Isolation: driverGVisor}, client.BuildOptions{})
	if err != nil {
		return failOps(ops, SystemForkbox, fmt.Errorf("build the template: %w", err))
	}
	defer f.c.DeleteTemplate(context.WithoutCancel(ctx), name)
	if res.Template.WarmSnapshot == "" {
		return failOps(ops, SystemForkbox, errors.New("the gVisor build kept no warm snapshot"))
	}
	// answered creates a session for req and fetches the page once: the
	// time from the create's request to the page.
	answered := func(ctx context.Context, req client.CreateRequest, warm bool) (time.Duration, error) {
		req.Template, req.Isolation = name, driverGVisor
		began := time.Now()
		s, _, err := f.createWith(ctx, req)
		if err != nil {
			return 0, err
		}
		defer f.destroy(context.WithoutCancel(ctx), s.ID)
		out, err := f.c.ExecCollect(ctx, s.ID, client.ExecRequest{Argv: []string{"curl", "-fsS", "--max-time", "5", "http://127.0.0.1:8000/"}})
		d := time.Since(began)
		switch {
		case err != nil:
			return 0, fmt.Errorf("fetch in %s: %w", s.ID, err)
		case out.ExitCode != 0 || !strings.Contains(string(out.Stdout), "Directory listing"):
			return 0, fmt.Errorf("fetch in %s: exit code %d (stderr %q)", s.ID, out.ExitCode, out.Stderr)
		case warm != (s.Snapshot == res.Template.WarmSnapshot):
			return 0, fmt.Errorf("session %s: restored from %q, want warm=%v", s.ID, s.Snapshot, warm)
		}
		return d, nil
	}
	fb := contender{system: SystemForkbox, step: func(ctx context.Context) ([]time.Duration, error) {
		cold, err := answered(ctx, client.CreateRequest{Env: map[string]string{"BENCH": "cold"}}, false)
		if err != nil {
			return nil, err
		}
		warm, err := answered(ctx, client.CreateRequest{}, true)
		if err != nil {
			return nil, err
		}
		return []time.Duration{cold, warm}, nil
	}}
	w, n := min(e.opts.Warmup, heavyWarmup), min(e.opts.N, gvisorMaxN)
	e.opts.progressf("ready: gVisor creates of a started-server template, cold and from its warm snapshot, x %d", w+n)
	return e.compete(ctx, w, n, ops, fb)
}
