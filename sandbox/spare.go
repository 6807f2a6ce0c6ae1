package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/userns"
)

// Spares are sandboxes started ahead of time with no files of their own:
// namespaces, cgroups, seccomp, a user namespace and host ids of their
// own, and the agent listening, on an empty read-only root. A create
// from any template or snapshot (runc tier, no network) takes one when
// the warm pools hold one: its writable layer is made as for a cold
// start, and the driver moves it in as the spare's root from the host
// side (runtime.FileTaker), which costs a few milliseconds instead of a
// runtime start. A spare is used once: it never ran anything but its
// agent, and it is never handed out again (the pools replace it).

// spareDirs and spareFiles are the mount targets of a spare's root: the
// kernel filesystems, the sandbox's own files and the agent (and, in the
// spare's own root, runtime.SpareNext). Every root
// a spare takes gets the same targets (makeTargets), since its mounts
// move there.
var (
	spareDirs  = []string{"/proc", "/dev", "/sys", "/etc"}
	spareFiles = []string{"/etc/hosts", "/etc/hostname", "/etc/machine-id", runtime.AgentTarget}
)

// SparesSupported reports whether this host can make spares: its default
// driver takes files (runtime.FileTaker), sandboxes get host ids of their
// own, and the storage driver's filesystem can be id-mapped (btrfs); and
// fills have not kept failing here (maxSpareFailures).
func (m *Manager) SparesSupported() bool {
	_, ok := m.runtimes.DefaultDriver().(runtime.FileTaker)
	return ok && m.spareFailures.Load() < maxSpareFailures && m.opts.IDs != nil && m.runtimes.DefaultDriver().Capabilities().JoinUserNamespace &&
		m.opts.Storage.Name() == "btrfs"
}

// spareRoot makes the empty root every spare starts on (once per daemon,
// shared and read-only): the mount targets and nothing else.
func (m *Manager) spareRoot() (string, error) {
	m.spareOnce.Do(func() {
		dir := m.opts.Layout.SpareRoot()
		m.spareErr = os.MkdirAll(dir, 0o755)
		if m.spareErr == nil {
			m.spareErr = makeTargets(dir, append(spareDirs, runtime.SpareNext), spareFiles, 0, 0)
		}
	})
	return m.opts.Layout.SpareRoot(), m.spareErr
}

// LaunchSpare makes one spare, in state pooled and owned by nobody, and
// returns its session id; on failure it is torn down. ErrUnavailable when
// the host cannot make spares (SparesSupported).
func (c *PoolCore) LaunchSpare(ctx context.Context) (string, error) {
	m := c.m
	if !m.SparesSupported() {
		return "", errdefs.Newf(errdefs.ErrUnavailable, "this host cannot make spare sandboxes (runc tier on btrfs with host ids)")
	}
	spec := node.CreateSpec{Isolation: m.runtimes.DefaultDriver().Name()}
	if err := normalizeCreate(&spec, m.opts.Limits); err != nil {
		return "", err
	}
	spec.Template = "" // a spare has none until it takes one
	rec, err := m.launchWith(ctx, spec, "", "", node.StatePooled, func() {}, func(ctx context.Context, sb *Sandbox) error {
		return m.startSpare(ctx, sb, spec)
	})
	if err != nil {
		return "", err
	}
	return rec.ID, nil
}

// startSpare starts spare sb on the empty root: its identity, its own
// files, the agent with no template's settings; the record becomes pooled.
func (m *Manager) startSpare(ctx context.Context, sb *Sandbox, spec node.CreateSpec) error {
	began := time.Now()
	defer func() { m.log.Debug("spare started", "session", sb.id, "ms", ms(time.Since(began))) }()
	root, err := m.spareRoot()
	if err != nil {
		return fmt.Errorf("spare root: %w", err)
	}
	if err := os.MkdirAll(sb.dir, 0o710); err != nil {
		return err
	}
	ident, err := m.hostRes.newIdentity(sb, "")
	if err != nil {
		return err
	}
	if ident == nil {
		return errdefs.Newf(errdefs.ErrUnavailable, "spares need host ids of their own")
	}
	// The id map of the files it will take, made now rather than then.
	if err := userns.PrepareMap(m.opts.Shift.UIDBase, ident.slice.First, m.opts.Shift.Size); err != nil {
		return err
	}
	mounts, err := ownFiles(sb)
	if err != nil {
		return err
	}
	ctlDir := filepath.Join(sb.dir, "ctl")
	if err := os.Mkdir(ctlDir, 0o755); err != nil {
		return err
	}
	if err := ident.create(ctx, ""); err != nil {
		return err
	}
	acfg, err := json.Marshal(wire.Config{DefaultUser: spec.User, Env: map[string]string{}})
	if err != nil {
		return err
	}
	socket, lf, err := listenAgent(sb)
	if err != nil {
		return err
	}
	defer lf.Close()
	rcfg := runtime.Config{
		ID: sb.id, StateDir: sb.dir, Mounts: mounts,
		Limits:    runtime.Limits{CPU: spec.CPU, MemoryBytes: spec.MemoryMB << 20, Pids: spec.Pids},
		AgentPath: m.opts.AgentPath, AgentEnv: []string{wire.ConfigEnv + "=" + string(acfg)},
		AgentListener: lf, ControlDir: ctlDir, Rlimits: m.runtimes.rlimits(),
	}
	ident.apply(&rcfg, "")
	rcfg.RootFS = root
	if err := m.runtimes.DefaultDriver().Create(ctx, rcfg); err != nil {
		return err
	}
	sb.agent = guest.New(socket)
	if err := m.awaitAgent(ctx, sb, m.runtimes.readyWait(m.runtimes.DefaultDriver())); err != nil {
		return err
	}
	_, err = m.save(ctx, sb, func(r *node.Session) error {
		if sb.deleteRequested {
			return errCreateAborted
		}
		r.State, r.StartedAt = node.StatePooled, time.Now().UTC()
		return nil
	})
	return err
}

// fromSpare serves the normalized, admitted create req from a ready spare:
// nil, nil when there is none or it failed (the caller starts the
// sandbox cold; the spare is torn down); an error when req proved wrong
// (a FieldError), with nothing left of the attempt.
func (m *Manager) fromSpare(ctx context.Context, req node.CreateSpec, idempotencyKey, hash string) (*node.Session, error) {
	if req.Network != nil || len(req.Volumes) > 0 || !m.SparesSupported() || req.Isolation != m.runtimes.DefaultDriver().Name() {
		return nil, nil
	}
	// A spare about to be ready beats a cold start (pool.AwaitSpare);
	// waited for outside the template lock, which removals need.
	waitFrom := time.Now()
	m.warm.AwaitSpare(ctx)
	if waited := time.Since(waitFrom); waited > time.Millisecond {
		m.log.Debug("waited for a spare", "ms", ms(waited))
	}
	// The template is loaded before a spare is taken (a bad request must
	// not use one up), and the spare counts as a user of it from then on
	// (fillTemplate), all under the lock that keeps removals out.
	m.tplMu.RLock()
	tpl, err := storage.LoadTemplate(m.opts.Layout.Template(req.Template))
	if err != nil {
		m.tplMu.RUnlock()
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, errdefs.InvalidField("template", "template %q does not exist", req.Template)
		}
		return nil, err
	}
	var sb *Sandbox
	id := m.warm.TakeSpare()
	if id != "" {
		sb = m.lookup(id)
	}
	if sb != nil {
		sb.mu.Lock()
		sb.fillTemplate = req.Template
		sb.mu.Unlock()
	}
	m.tplMu.RUnlock()
	if sb == nil {
		return nil, nil
	}
	// Once taken, the fill runs to its end (or its bound) whatever the
	// caller does, as a cold start does.
	fillCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	rec, err := m.adoptMember(ctx, sb, req, idempotencyKey, hash, func() error { return m.fillSpare(fillCtx, sb, tpl, req) })
	if err == nil {
		m.spareFailures.Store(0)
		return rec, nil
	}
	m.teardown(context.WithoutCancel(ctx), sb, node.ReasonDeleted, "spare failed: "+publicDetail(err))
	var fe *errdefs.FieldError
	if errors.As(err, &fe) {
		return nil, err
	}
	if n := m.spareFailures.Add(1); n == maxSpareFailures {
		m.log.Error("spares fail on this host: no more are made (creates start cold)", "failures", n, "err", err)
	} else {
		m.log.Warn("spare failed; starting cold", "session", id, "err", err)
	}
	return nil, nil
}

// maxSpareFailures: after that many fills in a row failed for reasons of
// the host (not of the request), no more spares are made.
const maxSpareFailures = 3

// fillSpare gives spare sb the files and limits of req from template tpl
// (which sb already counts as a user of): its writable layer from req's
// template or snapshot, id-mapped into its host ids; the template's host
// mounts and the writable directories; the agent's settings.
func (m *Manager) fillSpare(ctx context.Context, sb *Sandbox, tpl *storage.Template, req node.CreateSpec) error {
	began := time.Now()
	storageRoot, err := m.opts.Storage.Prepare(ctx, sb.id, storage.Source{Template: req.Template, Snapshot: req.Snapshot}, req.DiskMB<<20)
	if err != nil {
		return fmt.Errorf("writable layer: %w", err)
	}
	if err := checkMountTargets(storageRoot, tpl); err != nil {
		return err
	}
	prepared := time.Now()
	mounts := fileMounts(tpl, storageRoot)
	targets := make([]string, 0, len(mounts))
	for _, mt := range mounts {
		targets = append(targets, mt.Target)
	}
	if err := makeTargets(storageRoot, append(targets, spareDirs...), spareFiles, m.opts.Shift.UIDBase, m.opts.Shift.GIDBase); err != nil {
		return fmt.Errorf("mount targets: %w", err)
	}
	targeted := time.Now()
	rootfs, err := m.hostRes.mapRoot(sb, storageRoot)
	if err != nil {
		return err
	}
	mapped := time.Now()
	for i := range mounts {
		if rel, err := filepath.Rel(storageRoot, mounts[i].Source); err == nil && filepath.IsLocal(rel) {
			mounts[i].Source = filepath.Join(rootfs, rel)
		}
	}
	taker := m.runtimes.DefaultDriver().(runtime.FileTaker)
	if err := taker.TakeFiles(ctx, sb.id, runtime.Files{RootFS: rootfs, Mounts: mounts,
		Limits: runtime.Limits{CPU: req.CPU, MemoryBytes: req.MemoryMB << 20, Pids: req.Pids}}); err != nil {
		return err
	}
	took := time.Now()
	acfg := agentConfig(tpl, req, nil)
	if err := sb.agent.Init(ctx, wire.InitRequest{EnvVars: acfg.Env, DefaultUser: acfg.DefaultUser,
		DefaultWorkdir: acfg.Workdir, Path: acfg.Path, CodeWarm: acfg.CodeWarm}); err != nil {
		return fmt.Errorf("agent: %w", guest.Classify(ctx, err, ""))
	}
	if err := m.checkDefaults(ctx, sb, req); err != nil {
		return err
	}
	m.log.Debug("spare filled", "session", sb.id, "prepare_ms", ms(prepared.Sub(began)),
		"targets_ms", ms(targeted.Sub(prepared)), "idmap_ms", ms(mapped.Sub(targeted)),
		"take_ms", ms(took.Sub(mapped)), "agent_ms", ms(time.Since(took)))
	return nil
}

// makeTargets makes the directories dirs and the empty files files
// (absolute paths) under root where they are missing, owned by uid:gid,
// with missing parents. Nothing is followed: a symlink, or a file where a
// directory belongs, anywhere on the way is an error (the new files come
// from a snapshot that code in a sandbox wrote).
func makeTargets(root string, dirs, files []string, uid, gid uint32) error {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(rfd)
	mk := func(p string, file bool) error {
		parts := strings.Split(strings.Trim(filepath.Clean(p), "/"), "/")
		dir, err := unix.Dup(rfd)
		if err != nil {
			return err
		}
		defer func() { unix.Close(dir) }()
		for i, name := range parts {
			if name == "" || name == "." || name == ".." {
				return fmt.Errorf("%s: not a clean path", p)
			}
			last := i == len(parts)-1
			if last && file {
				fd, err := unix.Openat(dir, name, unix.O_CREAT|unix.O_EXCL|unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o644)
				if errors.Is(err, unix.EEXIST) {
					var st unix.Stat_t
					if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
						return err
					}
					if st.Mode&unix.S_IFMT != unix.S_IFREG {
						return fmt.Errorf("%s is not a regular file", p)
					}
					return nil
				}
				if err != nil {
					return fmt.Errorf("%s: %w", p, err)
				}
				defer unix.Close(fd)
				return unix.Fchown(fd, int(uid), int(gid))
			}
			err := unix.Mkdirat(dir, name, 0o755)
			created := err == nil
			if err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("%s: %w", p, err)
			}
			next, err := unix.Openat(dir, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("%s: %s is not a directory: %w", p, name, err)
			}
			if created {
				if err := unix.Fchownat(next, "", int(uid), int(gid), unix.AT_EMPTY_PATH); err != nil {
					unix.Close(next)
					return err
				}
			}
			unix.Close(dir)
			dir = next
		}
		return nil
	}
	for _, d := range dirs {
		if err := mk(d, false); err != nil {
			return err
		}
	}
	for _, f := range files {
		if err := mk(f, true); err != nil {
			return err
		}
	}
	return nil
}
