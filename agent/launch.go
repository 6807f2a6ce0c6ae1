package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/internal/envdpb/processpb"
)

// maxArgLen is the kernel's limit on one argv or envp string
// (MAX_ARG_STRLEN = 32 pages), minus the terminating NUL.
const maxArgLen = 32*4096 - 1

// userOOMScoreAdj is set on every started process so that, under memory
// pressure inside the sandbox, the kernel kills user code before the agent:
// 1000 makes a process the first choice whatever its size. The agent's own
// score is the runtime's (runc and gVisor specs pin it to 0); raising a
// score needs no privilege, so this write always works, and a process may
// lower its score again only down to the agent's (lowering further needs
// CAP_SYS_RESOURCE on the host).
const userOOMScoreAdj = "1000"

// launchSpec is a fully resolved process to start.
type launchSpec struct {
	path  string   // absolute executable path
	argv  []string // argv[0] is the command as given
	env   []string
	dir   string
	acc   *account
	stdin bool // give the process a stdin pipe (else /dev/null)
	pty   *processpb.PTY
	extra *os.File // passed as fd 3 (a long shell script), or nil
	// stdinData is staged input written to the stdin pipe first (then the
	// pipe is closed unless keepStdin); nil for none.
	stdinData *os.File
	keepStdin bool
}

// useScript makes staged script f the process's script: it is passed as
// fd 3 and "/proc/self/fd/3" is appended to argv, so cmd must be a shell
// and args its flags. ls owns f from now on, also on error.
func (ls *launchSpec) useScript(f *os.File) error {
	if ls.extra != nil {
		f.Close()
		return connect.NewError(connect.CodeInvalidArgument, errors.New("a staged script and a shell -c script longer than the argument limit"))
	}
	ls.extra = f
	ls.argv = append(ls.argv, "/proc/self/fd/3")
	return nil
}

// useStdin makes staged data f the start of the process's stdin (which
// must be a pipe), closed after it unless keep. ls owns f from now on.
func (ls *launchSpec) useStdin(f *os.File, keep bool) error {
	if ls.pty != nil || !ls.stdin {
		f.Close()
		return connect.NewError(connect.CodeInvalidArgument, errors.New("staged stdin needs a stdin pipe (stdin enabled, no PTY)"))
	}
	ls.stdinData, ls.keepStdin = f, keep
	return nil
}

// close releases the staged files ls owns when it is not launched.
func (ls *launchSpec) close() {
	for _, f := range []*os.File{ls.extra, ls.stdinData} {
		if f != nil {
			_ = f.Close()
		}
	}
}

// buildLaunch resolves a StartRequest for acc: environment (PATH, HOME,
// USER, LOGNAME, then the sandbox env, then the request's), working
// directory (request cwd, else the configured workdir, else home; it must
// exist), executable (looked up in the final PATH) and stdin mode.
func (a *Agent) buildLaunch(req *processpb.StartRequest, acc *account) (*launchSpec, error) {
	pc := req.GetProcess()
	if pc.GetCmd() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is empty"))
	}
	if len(pc.GetCmd()) > maxArgLen {
		return nil, connect.NewError(connect.CodeInvalidArgument,
			fmt.Errorf("process.cmd is %d bytes; the limit is %d", len(pc.GetCmd()), maxArgLen))
	}
	cfg := a.config()
	envMap := map[string]string{
		"PATH": cfg.Path, "HOME": acc.Home, "USER": acc.Name, "LOGNAME": acc.Name,
	}
	keys := []string{"PATH", "HOME", "USER", "LOGNAME"}
	add := func(k, v string) {
		if _, ok := envMap[k]; !ok {
			keys = append(keys, k)
		}
		envMap[k] = v
	}
	for _, k := range sortedKeys(cfg.Env) {
		add(k, cfg.Env[k])
	}
	for _, k := range sortedKeys(pc.GetEnvs()) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("env name %q is invalid", k))
		}
		add(k, pc.GetEnvs()[k])
	}
	env := make([]string, 0, len(keys))
	for _, k := range keys {
		if strings.ContainsRune(envMap[k], 0) {
			return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("env %s contains a NUL byte", k))
		}
		env = append(env, k+"="+envMap[k])
	}

	dir := acc.Home
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		dir = "/" // a user whose home does not exist (nobody's /nonexistent)
	}
	if cfg.Workdir != "" {
		dir = cfg.Workdir
	}
	if pc.Cwd != nil && pc.GetCwd() != "" {
		dir = resolvePath(pc.GetCwd(), acc.Home)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd %q is not an existing directory", dir))
	}

	path, err := lookPath(pc.GetCmd(), envMap["PATH"], dir)
	if err != nil {
		return nil, connect.NewError(connect.CodeNotFound, err)
	}
	ls := &launchSpec{
		path: path, argv: append([]string{pc.GetCmd()}, pc.GetArgs()...), env: env, dir: dir, acc: acc,
		stdin: req.Stdin == nil || req.GetStdin(), pty: req.GetPty(),
	}
	if err := ls.fitArgs(); err != nil {
		return nil, err
	}
	return ls, nil
}

// fitArgs makes a shell script longer than the kernel's per-argument limit
// runnable: `sh [flags] -c SCRIPT [name args...]` becomes
// `sh [flags] /proc/self/fd/3 [args...]` with SCRIPT in a memfd at fd 3.
// Any other over-long argument is an invalid_argument error (and then no
// memfd is left open).
func (ls *launchSpec) fitArgs() (err error) {
	defer func() {
		if err != nil && ls.extra != nil {
			_ = ls.extra.Close()
			ls.extra = nil
		}
	}()
	orig := ls.argv // indexes below refer to the request's argv, not the rewritten one
	for i, arg := range orig {
		if len(arg) <= maxArgLen {
			continue
		}
		if i == 0 || orig[i-1] != "-c" || ls.extra != nil {
			return connect.NewError(connect.CodeInvalidArgument,
				fmt.Errorf("argument %d is %d bytes; the limit is %d unless it is a shell -c script", i, len(arg), maxArgLen))
		}
		fd, err := unix.MemfdCreate("forkbox-script", unix.MFD_CLOEXEC)
		if err != nil {
			return fmt.Errorf("memfd for long script: %w", err)
		}
		f := os.NewFile(uintptr(fd), "forkbox-script")
		if _, err := f.WriteString(arg); err != nil {
			f.Close()
			return err
		}
		ls.extra = f
		rest := orig[i+1:]
		if len(rest) > 0 {
			rest = rest[1:] // with -c the first operand is $0; a script file sets $0 itself
		}
		argv := append(append([]string{}, orig[:i-1]...), "/proc/self/fd/3")
		ls.argv = append(argv, rest...)
	}
	return nil
}

// lookPath finds cmd like execvp would with the given PATH; a cmd containing
// a slash is taken relative to dir.
func lookPath(cmd, pathEnv, dir string) (string, error) {
	if strings.Contains(cmd, "/") {
		p := cmd
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if isExecutable(p) {
			return p, nil
		}
		return "", fmt.Errorf("%s: no such executable", cmd)
	}
	for _, d := range filepath.SplitList(pathEnv) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, cmd)
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		if isExecutable(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: executable file not found in $PATH", cmd)
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// launch starts ls, registers it with the reaper and wires its output to a
// new proc, whose first subscriber is first (so the caller of Start sees
// every byte). deadline, when not zero, kills the process group then.
func (a *Agent) launch(ls *launchSpec, tag string, config *processpb.ProcessConfig, first *subscriber, deadline time.Time) (*proc, error) {
	p := &proc{tag: tag, config: config, subs: map[*subscriber]struct{}{first: {}}, done: make(chan struct{})}
	var childFiles []*os.File // the child's ends, closed here after start
	closeChild := func() {
		for _, f := range childFiles {
			_ = f.Close()
		}
	}
	defer closeChild()

	files := make([]*os.File, 3, 4)
	var outR, errR *os.File
	sys := &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: ls.acc.UID, Gid: ls.acc.GID, Groups: ls.acc.Groups},
	}
	if ls.pty != nil {
		master, tty, err := pty.Open()
		if err != nil {
			return nil, fmt.Errorf("open pty: %w", err)
		}
		if err := pollPTY(master); err != nil {
			_ = master.Close()
			_ = tty.Close()
			return nil, fmt.Errorf("open pty: %w", err)
		}
		if sz := ls.pty.GetSize(); sz != nil {
			_ = resizePTY(master, sz)
		}
		_ = unix.Fchown(int(tty.Fd()), int(ls.acc.UID), -1)
		childFiles = append(childFiles, tty)
		files[0], files[1], files[2] = tty, tty, tty
		p.pty = master
		sys.Setsid, sys.Setctty, sys.Ctty = true, true, 0
	} else {
		sys.Setpgid = true
		if ls.stdin {
			r, w, err := os.Pipe()
			if err != nil {
				return nil, err
			}
			childFiles = append(childFiles, r)
			files[0], p.stdin, p.stdinPipe = r, w, w
		} else {
			null, err := a.devNull()
			if err != nil {
				return nil, err
			}
			files[0] = null
		}
		var err error
		var outW, errW *os.File
		if outR, outW, err = os.Pipe(); err != nil {
			p.closeStdin()
			return nil, err
		}
		childFiles = append(childFiles, outW)
		if errR, errW, err = os.Pipe(); err != nil {
			outR.Close()
			p.closeStdin()
			return nil, err
		}
		childFiles = append(childFiles, errW)
		files[1], files[2] = outW, errW
	}
	if ls.extra != nil {
		files = append(files, ls.extra)
		childFiles = append(childFiles, ls.extra)
	}

	pid, statusCh, err := a.startReaped(ls.path, ls.argv, &os.ProcAttr{Dir: ls.dir, Env: ls.env, Files: files, Sys: sys})
	if err != nil {
		for _, f := range []*os.File{outR, errR, p.stdin, p.pty} {
			if f != nil {
				_ = f.Close()
			}
		}
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("start %s: %w", ls.argv[0], err))
	}
	// First, so the window in which the process (and what it forks) still
	// has the agent's score is as short as it can be without a hook
	// between fork and exec.
	setOOMScoreAdj(pid)
	p.pid, p.began = pid, time.Now()
	// The sandbox's log (E2B's sandbox logs): which program ran, as
	// whom; never its arguments, which may hold secrets.
	a.log.Info("process started", "logger", "process", "pid", pid, "cmd", filepath.Base(ls.argv[0]), "user", ls.acc.Name, "tag", tag)
	closeChild()
	childFiles = nil
	a.procs.add(p)
	if ls.stdinData != nil {
		// Taken before the start event is sent: input sent after it waits
		// for the staged data.
		p.stdinMu.Lock()
		data, keep := ls.stdinData, ls.keepStdin
		ls.stdinData = nil
		go func() {
			defer p.stdinMu.Unlock()
			if err := p.writeStaged(context.Background(), data); err != nil {
				a.log.Debug("staged stdin", "pid", pid, "err", err)
			}
			if !keep && p.stdin != nil {
				_ = p.stdin.Close()
				p.stdin = nil
			}
		}()
	}

	exited := make(chan struct{})
	var killTimer *time.Timer
	if !deadline.IsZero() {
		killTimer = time.AfterFunc(time.Until(deadline), func() { _ = p.signal(syscall.SIGKILL) })
	}
	go func() {
		readers := make(chan struct{}, 2)
		n := 0
		if p.pty != nil {
			n = 1
			go func() {
				p.pump(p.pty, exited, func(b []byte) *processpb.ProcessEvent_DataEvent {
					return &processpb.ProcessEvent_DataEvent{Output: &processpb.ProcessEvent_DataEvent_Pty{Pty: b}}
				})
				readers <- struct{}{}
			}()
		} else {
			n = 2
			go func() {
				p.pump(outR, exited, func(b []byte) *processpb.ProcessEvent_DataEvent {
					return &processpb.ProcessEvent_DataEvent{Output: &processpb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
				})
				readers <- struct{}{}
			}()
			go func() {
				p.pump(errR, exited, func(b []byte) *processpb.ProcessEvent_DataEvent {
					return &processpb.ProcessEvent_DataEvent{Output: &processpb.ProcessEvent_DataEvent_Stderr{Stderr: b}}
				})
				readers <- struct{}{}
			}()
		}
		st := <-statusCh
		if killTimer != nil {
			killTimer.Stop()
		}
		close(exited)
		for i := 0; i < n; i++ {
			<-readers
		}
		for _, f := range []*os.File{outR, errR, p.pty} {
			if f != nil {
				_ = f.Close()
			}
		}
		p.abortStdin()
		p.cpu.Store(int64(st.cpu))
		p.ran.Store(int64(time.Since(p.began)))
		end := endFromStatus(st.ws)
		a.log.Info("process ended", "logger", "process", "pid", p.pid, "exit_code", end.ExitCode, "status", end.Status,
			"duration_ms", time.Since(p.began).Milliseconds())
		p.finish(end)
		a.procs.forgetLater(p)
	}()
	return p, nil
}

// startReaped starts path with argv and attr under the reaper (the agent
// is pid 1: the reaper waits for every child) and returns its pid and the
// channel its exit status comes on.
func (a *Agent) startReaped(path string, argv []string, attr *os.ProcAttr) (int, <-chan exitStatus, error) {
	return a.reaper.start(func() (int, error) {
		pr, err := os.StartProcess(path, argv, attr)
		if err != nil {
			return 0, err
		}
		pid := pr.Pid
		_ = pr.Release()
		return pid, nil
	})
}

// devNull returns the agent's one read-only descriptor of /dev/null, the
// stdin of processes started without one (each gets a copy as its fd 0;
// the agent's own is close-on-exec). It is opened on first use.
func (a *Agent) devNull() (*os.File, error) {
	a.nullOnce.Do(func() { a.null, a.nullErr = os.Open(os.DevNull) })
	return a.null, a.nullErr
}

// setOOMScoreAdj makes started process pid the OOM killer's first choice
// (userOOMScoreAdj), with a plain open, write and close of its
// oom_score_adj (the runtime's file machinery costs more syscalls, each of
// them dear in a sandbox). Best effort: a process that is already gone has
// no score to set.
func setOOMScoreAdj(pid int) {
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	_, _ = unix.Write(fd, []byte(userOOMScoreAdj))
	_ = unix.Close(fd)
}
