// Package agent is forkbox-agent, the guest agent that runs as init (pid 1)
// inside every sandbox.
//
// It reaps zombies, forwards termination signals to the processes it
// started, and serves the envd protocol (Connect-RPC process and filesystem
// services, plus plain-HTTP /files and /health) on a listening Unix socket
// the daemon hands it as a file descriptor. The socket's path exists only on
// the host, so nothing inside the sandbox can reach the agent's API.
//
// Wire contract: ../proto/envd and the E2B envd documentation. Behaviour
// that E2B SDKs depend on (first event is start, exit status strings,
// user from Basic auth, relative paths from the user's home) follows envd.
package agent

import (
	"context"
	"encoding/json"
	"errors"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/agent/interp"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/internal/envdpb/filesystempb/filesystempbconnect"
	"github.com/forkbox/forkbox/internal/envdpb/processpb/processpbconnect"
)

// DefaultPath is the PATH processes get when the config sets none.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Agent holds the services' shared state. It is safe for concurrent use.
type Agent struct {
	cfgMu  sync.RWMutex
	cfg    wire.Config // read through config(); /init changes it
	log    *slog.Logger
	reaper *reaper
	procs  *procTable
	stages *stageTable
	// accounts caches the users processes and file calls run as.
	accounts accountCache
	// null is the stdin of processes started without one (devNull).
	nullOnce sync.Once
	null     *os.File
	nullErr  error
	// errorLog receives the HTTP server's own errors; nil means the
	// standard logger.
	errorLog *stdlog.Logger

	// listenPath is the socket the agent binds itself ("" when it was
	// handed a listener); control is the checkpoint control file
	// (checkpoint.go). Both are set before Serve.
	listenPath, control string
	// srv is the HTTP server now serving; prepared is the generation of
	// an accepted prepare (0: none). Under srvMu.
	srvMu    sync.Mutex
	srv      *http.Server
	prepared uint64

	// tunnels are the port tunnels' connections from the host now open
	// (port.go), under tunnelMu: a checkpoint prepare closes them, since
	// the HTTP server does not track hijacked connections.
	tunnelMu sync.Mutex
	tunnels  map[net.Conn]struct{}

	// code is the code-execution service (code.go), made on first use.
	codeOnce sync.Once
	code     *interp.Service
}

// New returns an agent for cfg. It does not start the reaper; Serve does.
func New(cfg wire.Config, log *slog.Logger) *Agent {
	if cfg.DefaultUser == "" {
		cfg.DefaultUser = "user"
	}
	if cfg.Path == "" {
		cfg.Path = DefaultPath
	}
	return &Agent{cfg: cfg, log: log, reaper: newReaper(), procs: newProcTable(), stages: newStageTable()}
}

// config returns the current configuration (callers must not modify Env).
func (a *Agent) config() wire.Config {
	a.cfgMu.RLock()
	defer a.cfgMu.RUnlock()
	return a.cfg
}

// Handler returns the agent's HTTP handler: the Connect-RPC services under
// /process.Process/ and /filesystem.Filesystem/, plus /files, /envs and
// /health, the code-execution service under /code (package interp) and
// the port tunnel /port/{port} (port.go).
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	path, h := processpbconnect.NewProcessHandler(&processService{a: a})
	mux.Handle(path, h)
	path, h = filesystempbconnect.NewFilesystemHandler(newFilesystemService(a))
	mux.Handle(path, h)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /init", a.handleInit)
	mux.HandleFunc("POST /snapshot/prepare", a.handlePrepare)
	mux.HandleFunc("POST /stage", a.handleStage)
	mux.HandleFunc("DELETE /stage/{id}", a.handleUnstage)
	mux.HandleFunc("GET /files", a.handleFileDownload)
	mux.HandleFunc("POST /files", a.handleFileUpload)
	mux.HandleFunc("GET /envs", a.handleEnvs)
	mux.Handle(codePrefix+"/", a.codeService().Handler(codePrefix))
	mux.HandleFunc("POST "+codePrefix+"/warm", a.handleWarmCode)
	mux.HandleFunc("GET /port/{port}", a.handlePort)
	return mux
}

// Serve runs the reaper and serves the agent API on l until ctx ends.
// After a checkpoint prepare it waits for the resume (checkpoint.go) and
// serves again on a new socket at the same path.
func (a *Agent) Serve(ctx context.Context, l net.Listener) error {
	go a.reaper.run(ctx)
	a.warmCode()
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		a.srvMu.Lock()
		srv := a.srv
		a.srv = nil
		a.srvMu.Unlock()
		if srv != nil {
			_ = srv.Shutdown(shutdownCtx)
		}
	}()
	for {
		srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 30 * time.Second, ErrorLog: a.errorLog}
		var protos http.Protocols
		protos.SetHTTP1(true)
		protos.SetUnencryptedHTTP2(true)
		srv.Protocols = &protos
		a.srvMu.Lock()
		if ctx.Err() != nil {
			a.srvMu.Unlock()
			return nil
		}
		a.srv = srv
		a.srvMu.Unlock()
		err := srv.Serve(retryListener{l})
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		a.srvMu.Lock()
		gen := a.prepared
		a.prepared = 0
		a.srvMu.Unlock()
		if gen == 0 || ctx.Err() != nil {
			return nil
		}
		a.awaitResume(ctx, gen)
		if l, err = a.listen(); err != nil {
			return err
		}
	}
}

// Main is forkbox-agent's entry point as the sandbox's init: it reads its
// config from wire.ConfigEnv, listens on the inherited fd listenFD, forwards
// SIGTERM/SIGINT/SIGHUP to its processes and exits when asked to stop.
func Main(listenFD int) int {
	logOut := newCappedWriter(os.Stderr, maxLogBytes)
	log := slog.New(slog.NewTextHandler(logOut, nil))
	var cfg wire.Config
	if raw := os.Getenv(wire.ConfigEnv); raw != "" {
		if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
			log.Error("bad agent config", "err", err)
			return 2
		}
	}
	listenPath, control := os.Getenv(wire.ListenEnv), os.Getenv(wire.ControlEnv)
	startEnv := os.Environ()
	os.Clearenv()
	// What the kernel keeps of the environment too: gVisor shows it to
	// every process of the sandbox.
	if err := scrubEnviron(startEnv); err != nil {
		log.Warn("clear the start-up environment", "err", err)
	}
	if err := checkBoundingSet(); err != nil {
		log.Error("refusing to start", "err", err)
		return 2
	}
	// Not dumpable: no process in the sandbox (not even root, which lacks
	// CAP_SYS_PTRACE) may ptrace the agent or open /proc/1/fd.
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	// In the background: it takes a few ms, and nothing can start a fork
	// bomb before the agent serves its first exec.
	go prewarmThreads(16)

	a := New(cfg, log)
	a.errorLog = stdlog.New(logOut, "http: ", stdlog.LstdFlags)
	a.listenPath, a.control = listenPath, control
	var l net.Listener
	if listenPath != "" {
		ul, err := a.listen()
		if err != nil {
			log.Error("listen", "path", listenPath, "err", err)
			return 2
		}
		l = ul
	} else {
		f := os.NewFile(uintptr(listenFD), "agent-listener")
		if f == nil {
			log.Error("no listener fd", "fd", listenFD)
			return 2
		}
		fl, err := net.FileListener(f)
		_ = f.Close()
		if err != nil {
			log.Error("listener fd is not a socket", "fd", listenFD, "err", err)
			return 2
		}
		l = fl
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		for sig := range sigs {
			n := a.procs.signalAll(sig.(syscall.Signal))
			log.Info("forwarded signal", "signal", sig.String(), "groups", n)
			if sig == syscall.SIGTERM || sig == syscall.SIGINT {
				go func() {
					a.procs.waitIdle(5 * time.Second)
					cancel()
				}()
			}
		}
	}()
	log.Info("agent ready", "pid", os.Getpid(), "default_user", cfg.DefaultUser)
	if err := a.Serve(ctx, l); err != nil {
		log.Error("serve", "err", err)
		return 1
	}
	return 0
}

// prewarmThreads makes the Go runtime create n OS threads and park them as
// idle, so that later the agent rarely needs a new thread. A fork bomb inside
// the sandbox can exhaust the pids limit; a Go program that then fails to
// create a thread aborts, and the agent is the sandbox's init.
func prewarmThreads(n int) {
	var ready, release sync.WaitGroup
	ready.Add(n)
	release.Add(1)
	var done sync.WaitGroup
	done.Add(n)
	for i := 0; i < n; i++ {
		go func() {
			defer done.Done()
			runtime.LockOSThread()
			ready.Done()
			release.Wait()
			runtime.UnlockOSThread() // the thread returns to the idle pool
		}()
	}
	ready.Wait()
	release.Done()
	done.Wait()
}
