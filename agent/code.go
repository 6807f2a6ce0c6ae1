package agent

import (
	"fmt"
	"net/http"
	"os"
	"syscall"

	"github.com/forkbox/forkbox/agent/interp"
	"github.com/forkbox/forkbox/internal/httpjson"
)

// codePrefix is the path prefix of the code-execution service in the
// agent's API (the daemon maps E2B's port 49999 there).
const codePrefix = "/code"

// codeService returns the agent's code-execution service, made on first
// use.
func (a *Agent) codeService() *interp.Service {
	a.codeOnce.Do(func() { a.code = interp.NewService(codeLauncher{a}) })
	return a.code
}

// handleEnvs answers envd's GET /envs: the session's environment (the
// sandbox-wide variables set at create and by /init) as a JSON object of
// strings, which E2B's code-interpreter server reads to seed its kernels.
func (a *Agent) handleEnvs(w http.ResponseWriter, r *http.Request) {
	env := a.config().Env
	if env == nil {
		env = map[string]string{}
	}
	httpjson.Write(w, http.StatusOK, env)
}

// handleWarmCode answers the daemon's POST /code/warm once the default
// Python kernel is ready: 204, or 500 with why it did not start. (The
// daemon calls it for warm-pool members of the code-interpreter template,
// so that a ready member has a ready kernel; the edges do not pass it on.)
func (a *Agent) handleWarmCode(w http.ResponseWriter, r *http.Request) {
	if err := a.codeService().Warm(); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// warmCode starts the default Python kernel when the configuration asks
// for it (wire.Config.CodeWarm), in the background; a failure is logged
// and the first call tries again.
func (a *Agent) warmCode() {
	if !a.config().CodeWarm {
		return
	}
	go func() {
		if err := a.codeService().Warm(); err != nil {
			a.log.Warn("code interpreter: the default Python kernel did not start", "err", err)
		}
	}()
}

// codeLauncher starts the code-execution service's interpreters as the
// session's default user, the way exec starts processes (environment,
// credentials, process group, OOM score, reaper).
type codeLauncher struct{ a *Agent }

// Launch implements interp.Launcher.
func (l codeLauncher) Launch(argv []string, env map[string]string, dir string, files []*os.File) (int, <-chan struct{}, error) {
	a := l.a
	cfg := a.config()
	acc, err := a.accounts.lookup(cfg.DefaultUser)
	if err != nil {
		return 0, nil, err
	}
	envMap := map[string]string{"PATH": cfg.Path, "HOME": acc.Home, "USER": acc.Name, "LOGNAME": acc.Name}
	for k, v := range cfg.Env {
		envMap[k] = v
	}
	for k, v := range env {
		envMap[k] = v
	}
	envList := make([]string, 0, len(envMap))
	for _, k := range sortedKeys(envMap) {
		envList = append(envList, k+"="+envMap[k])
	}
	path, err := lookPath(argv[0], envMap["PATH"], dir)
	if err != nil {
		return 0, nil, err
	}
	null, err := a.devNull()
	if err != nil {
		return 0, nil, err
	}
	fds := make([]*os.File, len(files))
	for i, f := range files {
		if f == nil {
			f = null
		}
		fds[i] = f
	}
	sys := &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: acc.UID, Gid: acc.GID, Groups: acc.Groups},
		Setpgid:    true,
	}
	pid, statusCh, err := a.startReaped(path, argv, &os.ProcAttr{Dir: dir, Env: envList, Files: fds, Sys: sys})
	if err != nil {
		return 0, nil, fmt.Errorf("start %s: %w", argv[0], err)
	}
	setOOMScoreAdj(pid)
	exited := make(chan struct{})
	go func() {
		<-statusCh
		close(exited)
	}()
	return pid, exited, nil
}

// Identity implements interp.Launcher: the default user and the working
// directory.
func (l codeLauncher) Identity() string {
	return l.a.config().DefaultUser + "\x00" + l.Workdir()
}

// Env implements interp.Launcher: the session's environment.
func (l codeLauncher) Env() map[string]string {
	return l.a.config().Env
}

// Workdir implements interp.Launcher: the session's working directory,
// else the default user's home (else /).
func (l codeLauncher) Workdir() string {
	cfg := l.a.config()
	if cfg.Workdir != "" {
		return cfg.Workdir
	}
	acc, err := l.a.accounts.lookup(cfg.DefaultUser)
	if err != nil {
		return "/"
	}
	if fi, err := os.Stat(acc.Home); err == nil && fi.IsDir() {
		return acc.Home
	}
	return "/"
}
