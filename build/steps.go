package build

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/shell"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// action is a step that changes files, planned: what its key is made of
// and what it does.
type action struct {
	kind   string // "run", "copy" or "workdir"
	instr  string // the instruction as it runs (after expansion)
	inputs string // the digest of its inputs ("" for none)
	// run: a shell command line (Cmd) or an exec-form argv.
	cmd  string
	argv []string
	// copy: what goes where, as whom (owner: --chown's user; chmod:
	// --chmod's mode, 0 for the sources' own).
	picks []copyTarget
	owner string
	chmod int64
	// workdir: the directory to make.
	dir string
}

// copyTarget is one entry and its absolute path in the sandbox: an
// entry of the build context, or (src set) of an archive ADD extracts
// (archive: it keeps its owner) or a file ADD downloaded.
type copyTarget struct {
	e       *Entry
	to      string
	src     *Context
	archive bool
}

// plan applies instruction in to the build's state: ENV, ARG, USER,
// CMD, ENTRYPOINT (and LABEL, EXPOSE, MAINTAINER, which keep nothing)
// only change it (nil action); RUN, COPY, ADD and WORKDIR return the
// action that changes files. Variables are expanded as Docker does
// (BuildKit's shell lexer; RUN's command line is left to the shell).
func (r *run) plan(ctx context.Context, in Instr) (*action, error) {
	expand := func(word string) (string, error) {
		res, err := r.lex.ProcessWordWithMatches(word, shell.EnvsFromSlice(r.st.expandEnv()))
		return res.Result, err
	}
	if x, ok := in.Cmd.(instructions.SupportsSingleWordExpansion); ok {
		if err := x.Expand(expand); err != nil {
			return nil, err
		}
	}
	switch c := in.Cmd.(type) {
	case *instructions.EnvCommand:
		for _, kv := range c.Env {
			r.st.env = setenv(r.st.env, kv.Key, kv.Value)
		}
	case *instructions.ArgCommand:
		r.declareArgs(c)
	case *instructions.UserCommand:
		r.st.user = c.User
	case *instructions.CmdCommand:
		r.st.cmd, r.st.cmdSet = cmdline(c.ShellDependantCmdLine), true
	case *instructions.EntrypointCommand:
		r.st.entry, r.st.entSet = cmdline(c.ShellDependantCmdLine), true
		if !r.st.cmdSet {
			r.st.cmd = nil // ENTRYPOINT drops an inherited CMD (Docker's rule)
		}
	case *instructions.HealthCheckCommand:
		r.st.ready, r.st.readyS = readyCheck(c)
	case *instructions.WorkdirCommand:
		r.st.workdir = r.abs(c.Path)
		return &action{kind: "workdir", instr: r.st.workdir, dir: r.st.workdir}, nil
	case *instructions.RunCommand:
		a := &action{kind: "run"}
		if c.PrependShell {
			a.cmd = strings.Join(c.CmdLine, " ")
			a.instr = "sh " + a.cmd
		} else {
			a.argv = append([]string(nil), c.CmdLine...)
			j, _ := json.Marshal(a.argv)
			a.instr = "exec " + string(j)
		}
		return a, nil
	case *instructions.CopyCommand:
		return r.planCopy("copy", c.SourcePaths, c.DestPath, c.Chown)
	case *instructions.AddCommand:
		return r.planAdd(ctx, c)
	}
	return nil, nil
}

// cmdline is a CMD's or ENTRYPOINT's argv: the shell form runs with
// /bin/sh -c, as in Docker.
func cmdline(c instructions.ShellDependantCmdLine) []string {
	if c.PrependShell {
		return []string{"/bin/sh", "-c", strings.Join(c.CmdLine, " ")}
	}
	return append([]string(nil), c.CmdLine...)
}

// abs is p made absolute against the working directory ("/" when none
// was set, as in a Docker build).
func (r *run) abs(p string) string {
	if path.IsAbs(p) {
		return path.Clean(p)
	}
	wd := r.st.workdir
	if wd == "" {
		wd = "/"
	}
	return path.Join(wd, p)
}

// planCopy plans a COPY or ADD of sources from the context to dest.
func (r *run) planCopy(kind string, sources []string, dest, chown string) (*action, error) {
	if r.spec.Context == nil {
		return nil, fmt.Errorf("%s needs a build context (--context)", strings.ToUpper(kind))
	}
	toDir := strings.HasSuffix(dest, "/") || len(sources) > 1
	abs := r.abs(dest)
	var picks []Pick
	for _, s := range sources {
		p, dir, err := r.spec.Context.Select(s)
		if err != nil {
			return nil, err
		}
		if dir || strings.ContainsAny(s, "*?[") {
			toDir = true
		}
		picks = append(picks, p...)
	}
	if !toDir && len(picks) != 1 {
		toDir = true
	}
	owner, _, _ := strings.Cut(chown, ":")
	a := &action{kind: kind, owner: owner, instr: fmt.Sprintf("%q -> %q", sources, abs)}
	for _, p := range picks {
		to := abs
		if toDir {
			to = path.Join(abs, p.Rel)
		}
		a.picks = append(a.picks, copyTarget{e: p.E, to: to})
	}
	a.inputs = Digest(picks) + " owner " + chown
	return a, nil
}

// runStep runs action a of step idx in the build's session (made from
// the last step's result if there is none yet), snapshots the session
// and records the snapshot under key.
func (r *run) runStep(ctx context.Context, idx int, in Instr, a *action, key string) (string, error) {
	if err := r.ensureSession(ctx); err != nil {
		return "", err
	}
	var err error
	switch a.kind {
	case "run":
		err = r.runCommand(ctx, idx, in, a)
	case "copy":
		err = r.copyFiles(ctx, a)
	case "workdir":
		err = r.makeDir(ctx, a.dir, "root") // (as Docker's builder makes it)
	}
	if err != nil {
		return "", err
	}
	snap, err := r.b.node.Snapshot(ctx, r.session, node.SnapshotOptions{Name: fmt.Sprintf("build-%s-%d", r.name, idx)})
	if err != nil {
		return "", fmt.Errorf("step %d: snapshot: %w", idx, err)
	}
	if err := r.b.cache.Put(r.tenant, key, snap.ID); err != nil {
		return "", fmt.Errorf("step %d: record in the build cache: %w", idx, err)
	}
	return snap.ID, nil
}

// ensureSession makes the build's sandbox from r.src when there is none:
// the spec's tier, limits and egress allow-list, root as its default
// user, labelled forkbox.build=NAME.
func (r *run) ensureSession(ctx context.Context) error {
	if r.session != "" {
		return nil
	}
	cs := node.CreateSpec{Template: r.src.Template, Snapshot: r.src.Snapshot, User: "root",
		CPU: r.spec.CPU, MemoryMB: r.spec.MemoryMB, DiskMB: r.spec.DiskMB, Isolation: r.spec.Isolation,
		Metadata: map[string]string{"forkbox.build": r.name}, BuildStep: true}
	if lim := r.b.node.Info().Limits; lim.MaxTimeoutS > 0 {
		cs.TimeoutS = min(lim.MaxTimeoutS, 4*3600)
	}
	if len(r.spec.Allow) > 0 {
		cs.Network = &node.Network{Allow: r.spec.Allow}
	}
	s, _, err := r.b.node.Create(ctx, cs, "")
	if err != nil {
		return fmt.Errorf("start the build's sandbox: %w", err)
	}
	r.session = s.ID
	r.sandboxes++
	return nil
}

// endSession destroys the build's sandbox, if any.
func (r *run) endSession(ctx context.Context) {
	if r.session != "" {
		_ = r.b.node.Destroy(context.WithoutCancel(ctx), r.session)
		r.session = ""
	}
}

// userPart is the user steps run as: USER's user part, else root.
func (r *run) userPart() string {
	u, _, _ := strings.Cut(r.st.user, ":")
	if u == "" {
		return "root"
	}
	return u
}

// runCommand runs a RUN in the session as the build's user, in its
// working directory, with its environment; its output goes to the
// progress as log events. A non-zero exit is the 422 build-step-failed
// naming the step, its line, the exit code and the output's last 2 KiB.
func (r *run) runCommand(ctx context.Context, idx int, in Instr, a *action) error {
	tail := &tailBuffer{max: tailBytes}
	out := node.OutputFuncs(nil,
		func(p []byte) error {
			tail.write(p)
			r.emit(Event{Kind: "log", Step: idx, Stream: "stdout", Data: string(p)})
			return nil
		},
		func(p []byte) error {
			tail.write(p)
			r.emit(Event{Kind: "log", Step: idx, Stream: "stderr", Data: string(p)})
			return nil
		})
	timeout := r.spec.StepTimeoutS
	if timeout <= 0 {
		timeout = defaultStepTimeoutS
	}
	cwd := r.st.workdir
	if cwd == "" {
		cwd = "/"
	}
	es := node.ExecSpec{Cmd: a.cmd, Argv: a.argv, Env: r.st.runEnv(), Cwd: cwd, User: r.userPart(), TimeoutS: timeout}
	res, err := r.b.node.Exec(ctx, r.session, es, out)
	if err != nil {
		return fmt.Errorf("step %d (line %d): %w", idx, in.Line, err)
	}
	if res.ExitCode == 0 {
		return nil
	}
	r.emit(Event{Kind: "failed", Step: idx, Total: len(r.f.Instrs), Line: in.Line, Instruction: in.Text, ExitCode: res.ExitCode})
	why := fmt.Sprintf("exited %d", res.ExitCode)
	if res.TimedOut {
		why = fmt.Sprintf("ran past its %d s and was killed (exit %d)", timeout, res.ExitCode)
	}
	return errdefs.Typed(errdefs.ErrInvalidArgument, ProblemStepFailed, "step %d (line %d: %s) %s; its last output: %s",
		idx, in.Line, in.Text, why, strings.TrimSpace(tail.String()))
}

// copyFiles writes a COPY's entries into the session as root:
// directories made, files uploaded; then one shell command sets the
// modes the upload could not give (0644 is its own), makes the
// symlinks and gives everything to the --chown user, if any. That
// command needs chmod, ln and chown in the image (only when it has
// something to do).
func (r *run) copyFiles(ctx context.Context, a *action) error {
	modes := map[int64][]string{}
	owners := map[string][]string{}
	var links, owned []string
	made := map[string]bool{} // directories made
	for _, t := range a.picks {
		owned = append(owned, quote(t.to))
		if t.archive && a.owner == "" && (t.e.UID != 0 || t.e.GID != 0) {
			o := fmt.Sprintf("%d:%d", t.e.UID, t.e.GID)
			owners[o] = append(owners[o], quote(t.to))
		}
		mode := t.e.Mode
		if a.chmod != 0 && t.e.Type != tar.TypeSymlink {
			mode = a.chmod
		}
		switch t.e.Type {
		case tar.TypeDir:
			if err := r.makeDir(ctx, t.to, "root"); err != nil {
				return err
			}
			made[t.to] = true
			if mode != 0o755 {
				modes[mode] = append(modes[mode], t.to)
			}
		case tar.TypeReg:
			src := t.src
			if src == nil {
				src = r.spec.Context
			}
			if _, err := r.b.node.Upload(ctx, r.session, t.to, "root", src.Open(t.e), t.e.Size); err != nil {
				return fmt.Errorf("COPY %s: %w", t.e.Path, err)
			}
			if mode != 0o644 {
				modes[mode] = append(modes[mode], t.to)
			}
		case tar.TypeSymlink:
			// Its directory may be made by nothing else (an archive
			// of links only; the destination itself is no entry).
			if d := path.Dir(t.to); !made[d] {
				if err := r.makeDir(ctx, d, "root"); err != nil {
					return err
				}
				made[d] = true
			}
			// "--": a target may begin with "-".
			links = append(links, "ln -sfn -- "+quote(t.e.Link)+" "+quote(t.to))
		}
	}
	var script []string
	ms := make([]int64, 0, len(modes))
	for m := range modes {
		ms = append(ms, m)
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i] < ms[j] })
	for _, m := range ms {
		q := make([]string, 0, len(modes[m]))
		for _, p := range modes[m] {
			q = append(q, quote(p))
		}
		script = append(script, batched(fmt.Sprintf("chmod %o", m), q)...)
	}
	script = append(script, links...)
	if a.owner != "" && a.owner != "root" && len(owned) > 0 {
		script = append(script, batched("chown -h -- "+quote(a.owner), owned)...)
	}
	ids := make([]string, 0, len(owners))
	for o := range owners {
		ids = append(ids, o)
	}
	sort.Strings(ids)
	for _, o := range ids {
		script = append(script, batched("chown -h "+o, owners[o])...)
	}
	// In scripts of at most maxScript bytes each, in order: an archive's
	// thousands of paths stay below the kernel's argument limit.
	for len(script) > 0 {
		n, size := 0, 0
		for n < len(script) && (n == 0 || size+len(script[n]) < maxScript) {
			size += len(script[n]) + 4
			n++
		}
		if err := r.finishCopy(ctx, strings.Join(script[:n], " && ")); err != nil {
			return err
		}
		script = script[n:]
	}
	return nil
}

// makeDir makes directory dir (and its parents) in the session as user;
// one that exists is fine.
func (r *run) makeDir(ctx context.Context, dir, user string) error {
	if _, err := r.b.node.MakeDir(ctx, r.session, dir, user); err != nil && !errors.Is(err, errdefs.ErrConflict) {
		return fmt.Errorf("make %s: %w", dir, err)
	}
	return nil
}

// quote is s as one single-quoted shell word.
func quote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	b   []byte
}

// write appends p, dropping what is past max from the front.
func (t *tailBuffer) write(p []byte) {
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append([]byte(nil), t.b[len(t.b)-t.max:]...)
	}
}

// String is what is kept.
func (t *tailBuffer) String() string { return string(t.b) }
