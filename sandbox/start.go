package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/guest"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/netpolicy"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/storage"
)

// start builds the sandbox's files, starts it through the driver and waits
// for its agent; then the record becomes final (running, or pooled for a
// warm-pool member) and a running session's timeout is armed.
func (m *Manager) start(ctx context.Context, sb *Sandbox, tpl *storage.Template, req node.CreateSpec, final node.State) error {
	began := time.Now()
	if err := os.MkdirAll(sb.dir, 0o710); err != nil {
		return err
	}
	// A memory snapshot's checkpoint is verified and decrypted first: a
	// tampered one stops the create before anything starts.
	var image string
	var gen uint64
	if req.Snapshot != "" {
		sn, err := m.opts.Store.GetSnapshot(ctx, req.Snapshot)
		if err != nil {
			return err
		}
		if sn.MemoryDriver != "" {
			dir, g, release, err := m.snaps.OpenMemory(sn)
			if err != nil {
				return err
			}
			defer release()
			image, gen = dir, g
		}
	}
	rootfs, err := m.opts.Storage.Prepare(ctx, sb.id,
		storage.Source{Template: req.Template, Snapshot: req.Snapshot}, req.DiskMB<<20)
	if err != nil {
		return fmt.Errorf("writable layer: %w", err)
	}
	if err := checkMountTargets(rootfs, tpl); err != nil {
		return err
	}
	ident, err := m.hostRes.newIdentity(sb, rootfs)
	if err != nil {
		return err
	}
	mounts := fileMounts(tpl, rootfs)
	own, err := ownFiles(sb)
	if err != nil {
		return err
	}
	ctlDir := filepath.Join(sb.dir, "ctl")
	if err := os.Mkdir(ctlDir, 0o755); err != nil {
		return err
	}
	if image != "" {
		if err := writeResume(ctlDir, wire.ResumeFile{Generation: gen, Hostname: sb.id}); err != nil {
			return err
		}
	}
	mounts = append(mounts, own...)
	// A sandbox with an identity joins its own user namespace, so its
	// network namespace must be owned by that one (made with it).
	var makeNetns func(path string) error
	if ident != nil {
		if sb.Record().Network != nil {
			makeNetns = func(path string) error { return ident.create(ctx, path) }
		} else if err := ident.create(ctx, ""); err != nil {
			return err
		}
	}
	att, err := m.hostRes.attachNetwork(sb, false, makeNetns)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	netnsPath := ""
	if att != nil {
		sb.mu.Lock()
		sb.net = att
		sb.mu.Unlock()
		resolv := filepath.Join(sb.dir, "resolv.conf")
		if err := os.WriteFile(resolv, att.Resolv(), 0o644); err != nil {
			return err
		}
		mounts = append(mounts, runtime.Mount{Source: resolv, Target: "/etc/resolv.conf", ReadOnly: true})
		netnsPath = att.NetnsPath
	}
	brokerEnv, brokerMounts, err := m.bindSecrets(ctx, sb, rootfs)
	if err != nil {
		return fmt.Errorf("secrets: %w", err)
	}
	mounts = append(mounts, brokerMounts...)

	vmounts, err := m.hostRes.attachVolumes(ctx, sb, rootfs, ident)
	if err != nil {
		return err
	}
	mounts = append(mounts, vmounts...)

	acfg := agentConfig(tpl, req, att)
	for k, v := range brokerEnv {
		acfg.Env[k] = v
	}
	acfgJSON, err := json.Marshal(acfg)
	if err != nil {
		return err
	}
	socket, lf, err := listenAgent(sb)
	if err != nil {
		return err
	}
	defer lf.Close()

	prepared := time.Now()
	shift := m.opts.Shift
	idmap := []runtime.IDMap{{ContainerID: 0, HostID: shift.UIDBase, Size: shift.Size}}
	gidmap := []runtime.IDMap{{ContainerID: 0, HostID: shift.GIDBase, Size: shift.Size}}
	rcfg := runtime.Config{
		ID: sb.id, StateDir: sb.dir, RootFS: rootfs, Mounts: mounts, WritableRoot: req.BuildStep,
		Limits:    runtime.Limits{CPU: req.CPU, MemoryBytes: req.MemoryMB << 20, Pids: req.Pids},
		AgentPath: m.opts.AgentPath, AgentEnv: []string{wire.ConfigEnv + "=" + string(acfgJSON)},
		AgentListener: lf, UIDMap: idmap, GIDMap: gidmap, NetnsPath: netnsPath, ControlDir: ctlDir,
		Rlimits: m.runtimes.rlimits(),
	}
	if ident != nil {
		ident.apply(&rcfg, rootfs)
	}
	if image != "" {
		err = m.runtimes.driverOf(sb).Restore(ctx, rcfg, image)
	} else {
		err = m.runtimes.driverOf(sb).Create(ctx, rcfg)
	}
	if err != nil {
		return templateMountError(err, tpl)
	}
	launched := time.Now()
	sb.agent = guest.New(socket)
	if err := m.awaitAgent(ctx, sb, m.runtimes.readyWait(m.runtimes.driverOf(sb))); err != nil {
		return err
	}
	if image != "" {
		// The restored agent has the snapshot's settings: give it this
		// session's.
		if err := m.initAgent(ctx, sb, req); err != nil {
			return err
		}
	}
	if err := m.checkDefaults(ctx, sb, req); err != nil {
		return err
	}

	if _, err := m.save(ctx, sb, func(r *node.Session) error {
		if sb.deleteRequested {
			return errCreateAborted
		}
		now := time.Now().UTC()
		r.State = final
		r.StartedAt = now
		if final == node.StateRunning {
			r.ExpiresAt = now.Add(time.Duration(req.TimeoutS) * time.Second)
		}
		sb.lastUse = now
		return nil
	}); err != nil {
		return err
	}
	m.arm(sb)
	m.armIdle(sb)
	m.log.Debug("sandbox started", "session", sb.id, "prepare_ms", ms(prepared.Sub(began)),
		"runtime_ms", ms(launched.Sub(prepared)), "agent_ms", ms(time.Since(launched)))
	return nil
}

// writableDirs are the directories of a sandbox's root filesystem it may
// write; the rest of its root is read-only.
var writableDirs = []string{"/home/user", "/root", "/tmp"}

// fileMounts returns the mounts a sandbox's files need over its root
// filesystem rootfs: template tpl's host directories (read-only) and
// rootfs's writable directories.
func fileMounts(tpl *storage.Template, rootfs string) []runtime.Mount {
	mounts := append([]runtime.Mount(nil), tpl.HostMounts...)
	for _, d := range writableDirs {
		mounts = append(mounts, runtime.Mount{Source: filepath.Join(rootfs, d), Target: d})
	}
	return mounts
}

// ownFiles writes sandbox sb's own /etc/hosts, /etc/hostname and
// /etc/machine-id into its state directory and returns their read-only
// mounts. Every sandbox has its own machine id (a clone of a memory
// snapshot too: the file is read from its own state directory).
func ownFiles(sb *Sandbox) ([]runtime.Mount, error) {
	files := []struct{ name, target, data string }{
		{"hosts", "/etc/hosts", fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t%s\n", sb.id)},
		{"hostname", "/etc/hostname", sb.id + "\n"},
		{"machine-id", "/etc/machine-id", newToken()[:32] + "\n"},
	}
	var mounts []runtime.Mount
	for _, f := range files {
		p := filepath.Join(sb.dir, f.name)
		if err := os.WriteFile(p, []byte(f.data), 0o644); err != nil {
			return nil, err
		}
		mounts = append(mounts, runtime.Mount{Source: p, Target: f.target, ReadOnly: true})
	}
	return mounts, nil
}

// agentConfig returns the agent's settings for a sandbox of template tpl
// made for req, with the environment of its network attachment att (nil:
// none): the template's variables and PATH, then req's, then att's.
func agentConfig(tpl *storage.Template, req node.CreateSpec, att *netpolicy.Attachment) wire.Config {
	acfg := wire.Config{DefaultUser: req.User, Workdir: req.Workdir, Env: map[string]string{}, CodeWarm: req.CodeWarm}
	if acfg.Workdir == "" {
		acfg.Workdir = tpl.Workdir
	}
	for _, kv := range tpl.Env {
		k, v, _ := cutEnv(kv)
		if k == "PATH" {
			acfg.Path = v
			continue
		}
		acfg.Env[k] = v
	}
	for k, v := range req.Env {
		acfg.Env[k] = v
	}
	if att != nil {
		for _, kv := range att.Env() {
			k, v, _ := cutEnv(kv)
			acfg.Env[k] = v
		}
	}
	return acfg
}

// listenAgent makes the agent's socket in sb's state directory (0600) and
// returns its path and the listening socket as a file to hand the
// sandbox (the caller closes it; the socket stays on disk).
func listenAgent(sb *Sandbox) (string, *os.File, error) {
	socket := filepath.Join(sb.dir, "agent.sock")
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return "", nil, fmt.Errorf("agent socket: %w", err)
	}
	ul.SetUnlinkOnClose(false)
	defer ul.Close()
	if err := os.Chmod(socket, 0o600); err != nil {
		return "", nil, err
	}
	lf, err := ul.File()
	if err != nil {
		return "", nil, err
	}
	return socket, lf, nil
}

// ms is d in milliseconds with a fraction, for logs.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// checkDefaults makes sure the session's default user and working directory
// exist in its template, which only the agent can tell; else the create
// would succeed and every exec without a user or cwd of its own fail.
//
// The standard accounts with no workdir need no check: the agent resolves
// "user" and "root" even without passwd entries, and every template has
// their homes (storage.PrepareUserDirs). That spares most creates a round
// trip while the fresh agent is still cold (several ms).
func (m *Manager) checkDefaults(ctx context.Context, sb *Sandbox, req node.CreateSpec) error {
	if req.Workdir == "" && (req.User == "user" || req.User == "root") {
		return nil
	}
	p := req.Workdir
	if p == "" {
		p = "/"
	}
	e, err := sb.agent.Stat(ctx, p, req.User)
	switch class := guest.Classify(ctx, err, ""); {
	case err == nil && e.Type == "file":
		return errdefs.InvalidField("workdir", "%q is not a directory", p)
	case err == nil:
		return nil
	case errdefs.Field(class) == "user": // (the agent's unauthenticated)
		return errdefs.InvalidField("user", "user %q does not exist in template %q", req.User, req.Template)
	case errors.Is(class, errdefs.ErrNotFound):
		return errdefs.InvalidField("workdir", "%q does not exist in template %q", p, req.Template)
	}
	return fmt.Errorf("agent: check user and workdir: %v: %w", err, errdefs.ErrUnavailable)
}

func cutEnv(kv string) (string, string, bool) {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return kv, "", false
}

// templateMountError turns a runtime's failure to mount one of the
// sandbox's own files into imported template tpl (its /etc/hosts is a
// symlink into /proc, say: storage.PrepareMountTargets replaces such
// entries at import, so only templates imported before it have them)
// into an invalid-argument error naming the template. Other errors, and
// any error with the built-in template (which forkbox writes itself),
// are returned as they are.
func templateMountError(err error, tpl *storage.Template) error {
	var me *runtime.MountError
	if !errors.As(err, &me) || tpl.Source == "builtin" {
		return err
	}
	return errdefs.InvalidField("template", "template %q cannot be started: %v, because the template has a symlink, "+
		"a directory or a special file there; delete the template and import it again (imports now replace such entries)",
		tpl.Name, me)
}

// checkMountTargets refuses, before the runtime is asked, a root
// filesystem of imported template tpl whose etc or storage.MountTargets
// are of a kind the sandbox's own files cannot be mounted over (only
// templates imported before storage.PrepareMountTargets existed have
// them): the runtimes fail on them with errors that do not always say
// which path (runsc), so the check is made here for every tier. Missing
// entries are fine (the runtime creates them). Nothing is followed: etc
// must be a real directory before anything in it is looked at.
func checkMountTargets(rootfs string, tpl *storage.Template) error {
	if tpl.Source == "builtin" {
		return nil
	}
	bad := func(target, kind string) error {
		return errdefs.InvalidField("template", "template %q cannot be started: its %s is %s, which the sandbox's own "+
			"file cannot be mounted over; delete the template and import it again (imports now replace such entries)",
			tpl.Name, target, kind)
	}
	fi, err := os.Lstat(filepath.Join(rootfs, "etc"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return err
	case !fi.IsDir():
		return bad("/etc", kindOf(fi.Mode()))
	}
	for _, rel := range storage.MountTargets {
		fi, err := os.Lstat(filepath.Join(rootfs, rel))
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return err
		case !fi.Mode().IsRegular():
			return bad("/"+rel, kindOf(fi.Mode()))
		}
	}
	return nil
}

// kindOf names the kind of file of mode m ("a symlink").
func kindOf(m os.FileMode) string {
	switch {
	case m&os.ModeSymlink != 0:
		return "a symlink"
	case m.IsDir():
		return "a directory"
	case m.IsRegular():
		return "a regular file"
	}
	return "a special file"
}
