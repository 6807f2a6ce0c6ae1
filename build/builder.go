package build

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/template"
	"github.com/forkbox/forkbox/tenancy"
)

// ProblemStepFailed is the problem type of a build whose RUN exited
// non-zero (422; the detail names the step, its line, its exit code and
// its last output).
const ProblemStepFailed = "build-step-failed"

// defaultStepTimeoutS is how long one RUN may take by default, in seconds.
const defaultStepTimeoutS = 1800

// tailBytes is how much of a failing RUN's output its error keeps.
const tailBytes = 2048

// Builder builds templates from Dockerfiles on a node, installing them
// into a catalog. It is safe for concurrent use: two builds of one name
// at once are refused by the catalog (ErrConflict).
type Builder struct {
	node    node.Node
	catalog *template.Catalog
	cache   *Cache
	fetcher *netpolicy.Fetcher
}

// SetFetcher gives the builder the downloader of ADD URLs (the daemon's
// egress service's: netpolicy.Service.Fetcher); without one an ADD of a
// URL is ErrUnavailable. Call it before the first build.
func (b *Builder) SetFetcher(f *netpolicy.Fetcher) { b.fetcher = f }

// New returns a builder whose RUN steps run in sessions of n and whose
// templates go into c; its step cache is c.BuildCacheDir(). With a nil
// c (a server without a catalog) every build is ErrUnavailable.
func New(n node.Node, c *template.Catalog) *Builder {
	b := &Builder{node: n, catalog: c}
	if c != nil {
		b.cache = NewCache(c.BuildCacheDir())
	}
	return b
}

// Spec is one build's request.
type Spec struct {
	// Dockerfile is the Dockerfile's text.
	Dockerfile []byte
	// Context is the build context COPY and ADD read (nil: empty).
	Context *Context
	// SpoolDir is where an ADD's download or extracted archive is
	// spooled while the build runs ("": the system's temporary
	// directory); the files are removed when the build ends.
	SpoolDir string
	// BuildArgs give ARGs values (an ARG the Dockerfile does not declare
	// is not used, as in Docker).
	BuildArgs map[string]string
	// Allow is the egress allow-list of every RUN's sandbox (the
	// session API's form: "host:port", "*.suffix:port", CIDRs); empty:
	// no network.
	Allow []string
	// Isolation is the tier RUN steps run in ("" = the node's default).
	Isolation string
	// CPU (cores), MemoryMB and DiskMB (MiB) bound each step's sandbox
	// (0: the node's defaults); StepTimeoutS bounds each RUN, in seconds
	// (0: 1800).
	CPU          float64
	MemoryMB     int64
	DiskMB       int64
	StepTimeoutS int64
	// Pull is how a FROM of a registry image is pulled (its Auth,
	// AnyAddress, InsecureRegistries; the rest is set by the builder).
	Pull template.PullOptions
	// ReservePull, when not nil, holds a place of the tenant's template
	// quota for the template a FROM of a registry image is pulled into
	// (until release; an error refuses the pull).
	ReservePull func(ctx context.Context) (release func(), err error)
	// MaxBytes caps the finished template's files (0: no cap); MaxName
	// names the limit in the 413.
	MaxBytes int64
	MaxName  string
	// ReadyCmd, when not nil, is the template's ready check (argv, as
	// ReadyLine returns it), in place of the Dockerfile's HEALTHCHECK;
	// ReadyTimeoutS, when positive, bounds the wait for it in seconds
	// (in place of HEALTHCHECK --start-period).
	ReadyCmd      []string
	ReadyTimeoutS int64
	// Progress, when not nil, gets the build's events in order (from
	// the build's goroutine).
	Progress func(Event)
}

// Event is one thing a build reports as it goes.
type Event struct {
	// Kind is "step" (a step begins: Step, Total, Line, Instruction),
	// "done" (a step ended: Cached, Snapshot, DurationMS), "log" (a RUN's
	// output: Stream "stdout" or "stderr", Data) or "failed" (a RUN
	// exited non-zero: ExitCode).
	Kind        string
	Step, Total int
	Line        int
	Instruction string
	Cached      bool
	Snapshot    string
	DurationMS  int64
	Stream      string
	Data        string
	ExitCode    int
}

// StepResult is how one step of a build went.
type StepResult struct {
	Step        int
	Line        int
	Instruction string
	// Cached: the step's result came from the cache (no sandbox ran
	// it). Steps that change no file (ENV, ARG, USER, CMD, ...) run
	// nowhere; they say Cached when the cache had their key (the same
	// step after the same steps).
	Cached bool
	// Snapshot holds the step's result ("" for metadata steps).
	Snapshot   string
	DurationMS int64
}

// Result is a finished build: the template and every step.
type Result struct {
	Template *storage.Template
	Steps    []StepResult
	// Sandboxes is how many sandbox sessions the build made (0 for a
	// fully cached build).
	Sandboxes int
}

// Build makes template name for ctx's caller's tenant from spec. The
// name is held for the whole build (ErrConflict for a second build,
// import or pull of it, or when it exists). Errors: ErrInvalidArgument
// naming "dockerfile" and the line for syntax errors, unsupported
// instructions and COPY sources not in the context; the 422
// build-step-failed for a RUN that exited non-zero; ErrNotFound for a
// FROM naming no template the caller sees; the session API's errors for
// a step's sandbox (limits, egress policy, capacity). Nothing is
// registered unless the whole build succeeded; the snapshots of the
// steps that did succeed stay cached for the next build.
func (b *Builder) Build(ctx context.Context, name string, spec Spec) (*Result, error) {
	if b.catalog == nil {
		return nil, errdefs.Newf(errdefs.ErrUnavailable, "this server has no template catalog: it builds nothing")
	}
	f, err := Parse(spec.Dockerfile)
	if err != nil {
		return nil, err
	}
	if err := ReadyTimeout("ready_timeout_s", spec.ReadyTimeoutS); err != nil {
		return nil, err
	}
	release, err := b.catalog.Reserve(name)
	if err != nil {
		return nil, err
	}
	defer release()
	r := &run{b: b, spec: spec, name: name, tenant: tenancy.TenantOf(ctx, ""), f: f}
	defer r.endSession(ctx)
	defer r.removeSpools()
	return r.build(ctx)
}

// run is one build under way.
type run struct {
	b      *Builder
	spec   Spec
	name   string
	tenant string
	f      *File
	st     state
	lex    *shell.Lex
	// src is what the next step starts from: the FROM template, or the
	// snapshot of the last step that changed files.
	src storage.Source
	// session is the sandbox steps run in once one missed the cache.
	session   string
	sandboxes int
	// spools are the ADD spool files (removed when the build ends);
	// spooled is the bytes written to them, all within addLimit;
	// entries counts the entries of the archives indexed from them.
	spools  []*os.File
	spooled int64
	entries int
}

// build runs every step and installs the template.
func (r *run) build(ctx context.Context) (*Result, error) {
	r.lex = shell.NewLex('\\')
	r.st.args = map[string]string{}
	tpl, err := r.from(ctx)
	if err != nil {
		return nil, err
	}
	r.st.env = append([]string(nil), tpl.Env...)
	r.st.workdir, r.st.user, r.st.cmd = tpl.Workdir, tpl.User, tpl.Cmd
	r.st.ready, r.st.readyS = tpl.ReadyCmd, tpl.ReadyTimeoutS
	r.src = storage.Source{Template: tpl.Name}
	key := fromKey(tpl, r.spec.Isolation)
	res := &Result{}
	total := len(r.f.Instrs)
	for i, in := range r.f.Instrs {
		start := time.Now()
		r.emit(Event{Kind: "step", Step: i + 1, Total: total, Line: in.Line, Instruction: in.Text})
		sr := StepResult{Step: i + 1, Line: in.Line, Instruction: in.Text}
		act, err := r.plan(ctx, in)
		if err != nil {
			if c := errdefs.Class(err); c != errdefs.ErrInvalidArgument && c != errdefs.ErrInternal {
				return nil, fmt.Errorf("line %d: %w", in.Line, err) // a limit, an unavailable service: its own class
			}
			return nil, errdefs.InvalidField("dockerfile", "line %d: %v", in.Line, err)
		}
		if act != nil {
			key = stepKey(key, act.kind, act.instr, &r.st, act.inputs)
			snap, hit := r.cached(ctx, key)
			if !hit {
				if snap, err = r.runStep(ctx, i+1, in, act, key); err != nil {
					return nil, err
				}
			}
			r.src = storage.Source{Snapshot: snap}
			sr.Snapshot, sr.Cached = snap, hit
		} else {
			// A step that changes no file is in the chain too (as in
			// Docker's cache), recorded without a snapshot.
			key = stepKey(key, "meta", in.Text, &r.st, "")
			if _, sr.Cached = r.b.cache.Get(r.tenant, key); !sr.Cached {
				if err := r.b.cache.Put(r.tenant, key, ""); err != nil {
					return nil, fmt.Errorf("step %d: record in the build cache: %w", i+1, err)
				}
			}
		}
		sr.DurationMS = time.Since(start).Milliseconds()
		res.Steps = append(res.Steps, sr)
		r.emit(Event{Kind: "done", Step: i + 1, Total: total, Line: in.Line, Instruction: in.Text,
			Cached: sr.Cached, Snapshot: sr.Snapshot, DurationMS: sr.DurationMS})
	}
	r.endSession(ctx)
	res.Sandboxes = r.sandboxes
	cmd := append(append([]string(nil), r.st.entry...), r.st.cmd...)
	if !r.st.entSet && !r.st.cmdSet {
		cmd = tpl.Cmd
	}
	built := template.Built{Source: "build", Env: r.st.env, Workdir: r.st.workdir, User: r.st.user,
		Cmd: cmd, StartCmd: (r.st.entSet || r.st.cmdSet || len(tpl.StartCmd) > 0) && len(cmd) > 0,
		Steps: total, HostMounts: tpl.HostMounts, ReadyCmd: r.st.ready, ReadyTimeoutS: r.st.readyS, Tier: r.spec.Isolation}
	if built.Tier == "" {
		built.Tier = r.b.node.Info().DefaultDriver
	}
	if r.spec.ReadyCmd != nil {
		built.ReadyCmd = r.spec.ReadyCmd
	}
	if r.spec.ReadyTimeoutS > 0 {
		built.ReadyTimeoutS = r.spec.ReadyTimeoutS
	}
	d := sha256.Sum256([]byte(key + "\n" + strings.Join(built.Env, "\x00") + "\n" + built.Workdir + "\n" + built.User + "\n" + strings.Join(cmd, "\x00") +
		"\n" + strings.Join(built.ReadyCmd, "\x00") + fmt.Sprintf("\n%d", built.ReadyTimeoutS)))
	built.Digest = "sha256:" + hex.EncodeToString(d[:])
	t, err := r.b.catalog.InstallBuilt(ctx, r.name, r.tenant, r.src, built, r.spec.MaxBytes, r.spec.MaxName)
	if err != nil {
		return nil, err
	}
	if err := r.warm(ctx, t); err != nil {
		// (registered nothing: the template goes again)
		if derr := r.b.catalog.Delete(context.WithoutCancel(ctx), r.name); derr != nil {
			return nil, fmt.Errorf("%w (and removing the template failed: %v)", err, derr)
		}
		return nil, err
	}
	res.Template = t
	res.Sandboxes = r.sandboxes
	return res, nil
}

// from resolves the FROM: a template the caller sees (base, one of its
// own, a shared one), else a registry image, pulled once into a
// template of the caller's (fromTemplateName) and reused by later
// builds.
func (r *run) from(ctx context.Context) (*storage.Template, error) {
	for _, a := range r.f.MetaArgs {
		r.declareArgs(a)
	}
	ref, err := r.lex.ProcessWordWithMatches(r.f.From, shell.EnvsFromSlice(r.st.expandEnv()))
	if err != nil {
		return nil, errdefs.InvalidField("dockerfile", "line %d: %v", r.f.FromLine, err)
	}
	from := ref.Result
	// ARGs before FROM are in scope for FROM only (Docker's rule).
	r.st.args, r.st.argSet = map[string]string{}, nil
	if from == "scratch" {
		return nil, errdefs.InvalidField("dockerfile", "line %d: FROM scratch is not supported: start from base, a template or an image", r.f.FromLine)
	}
	tpl, err := r.b.catalog.Get(ctx, from)
	if err == nil {
		return tpl, nil
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	if !strings.ContainsAny(from, "/:.@") {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "line %d: FROM %s: no template of that name (and not an image reference)", r.f.FromLine, from)
	}
	pulled := fromTemplateName(r.tenant, from)
	if tpl, err := r.b.catalog.Get(ctx, pulled); err == nil {
		return tpl, nil
	}
	if r.spec.ReservePull != nil {
		release, err := r.spec.ReservePull(ctx)
		if err != nil {
			return nil, fmt.Errorf("line %d: FROM %s: %w", r.f.FromLine, from, err)
		}
		defer release()
	}
	o := r.spec.Pull
	o.Progress, o.StartCmd = nil, false
	o.MaxBytes, o.MaxBytesName = r.spec.MaxBytes, r.spec.MaxName
	tpl, err = r.b.catalog.Pull(ctx, r.tenant, pulled, from, o)
	if err != nil {
		return nil, fmt.Errorf("line %d: FROM %s: %w", r.f.FromLine, from, err)
	}
	return tpl, nil
}

// fromTemplateName is the template a FROM of registry image ref is
// pulled into for tenant (template names are host-wide): "from-" and 16
// hex digits of the sha256 of the tenant's name, a newline and ref.
func fromTemplateName(tenant, ref string) string {
	d := sha256.Sum256([]byte(tenant + "\n" + ref))
	return "from-" + hex.EncodeToString(d[:8])
}

// cached returns the snapshot key's result is in, when the cache has it
// and the snapshot still exists.
func (r *run) cached(ctx context.Context, key string) (string, bool) {
	snap, ok := r.b.cache.Get(r.tenant, key)
	if !ok || snap == "" {
		return "", false
	}
	if _, err := r.b.node.GetSnapshot(ctx, snap); err != nil {
		_ = r.b.cache.Forget(r.tenant, key)
		return "", false
	}
	return snap, true
}

// emit sends e to the spec's Progress.
func (r *run) emit(e Event) {
	if r.spec.Progress != nil {
		r.spec.Progress(e)
	}
}

// declareArgs applies ARG a: each name gets the build argument's value,
// else its default (expanded); one with neither stays unset (RUN does
// not see it), as in Docker.
func (r *run) declareArgs(a *instructions.ArgCommand) {
	for _, kv := range a.Args {
		v, ok := r.spec.BuildArgs[kv.Key]
		if !ok && kv.Value == nil {
			continue
		}
		if !ok {
			v = *kv.Value
			if x, err := r.lex.ProcessWordWithMatches(v, shell.EnvsFromSlice(r.st.expandEnv())); err == nil {
				v = x.Result
			}
		}
		if _, seen := r.st.args[kv.Key]; !seen {
			r.st.argSet = append(r.st.argSet, kv.Key)
		}
		r.st.args[kv.Key] = v
	}
}
