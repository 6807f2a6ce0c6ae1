package wire

// Environment variables the agent reads when it starts.
const (
	// ConfigEnv carries the agent's Config as JSON. The agent removes it
	// from its environment before it runs anything.
	ConfigEnv = "FORKBOX_AGENT_CONFIG"
	// ListenEnv, when set, is a Unix socket path the agent binds itself
	// (mode 0600) instead of accepting on the inherited fd: for runtimes
	// that cannot hand a listening socket into the sandbox (gVisor, where
	// the path is in a directory shared with the host through
	// --host-uds).
	ListenEnv = "FORKBOX_AGENT_LISTEN"
	// ControlEnv names the control file the agent polls after a snapshot
	// prepare (PrepareRequest) for its ResumeFile; the agent refuses the
	// prepare when it is unset (the runc tier needs none).
	ControlEnv = "FORKBOX_AGENT_CONTROL"
)

// KillGroupCommand is the agent binary's first argument that makes it
// signal a process group from inside the sandbox and exit, instead of
// serving: "forkbox-agent kill-group PGID SIGNAL" prints how many
// processes were in the group on stdout. Drivers that cannot reach a
// sandbox's processes from the host (gVisor) run it.
const KillGroupCommand = "kill-group"

// Config is the agent's start-up configuration, set by the daemon per
// sandbox and passed as JSON in ConfigEnv.
type Config struct {
	// DefaultUser runs processes and owns files when a call names no user ("user").
	DefaultUser string `json:"default_user"`
	// Workdir is the default working directory; "" means the user's home.
	Workdir string `json:"workdir,omitempty"`
	// Env is the sandbox-wide environment, applied after PATH, HOME and USER
	// and before a call's own variables.
	Env map[string]string `json:"env,omitempty"`
	// Path is the default PATH; "" is the agent's default.
	Path string `json:"path,omitempty"`
	// CodeWarm makes the agent start the code-execution service's
	// default Python kernel at start, so the first call finds it ready
	// (sessions of the code-interpreter template).
	CodeWarm bool `json:"code_warm,omitempty"`
}
