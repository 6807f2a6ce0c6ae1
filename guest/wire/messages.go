package wire

// InitRequest is the body of the agent's POST /init, envd's way to hand a
// running agent the settings of the session it now serves (the daemon
// uses it when a warm-pool sandbox is claimed). Fields left out keep
// their value; EnvVars are added to the environment, replacing variables
// of the same name. Its JSON names are envd's.
type InitRequest struct {
	EnvVars        map[string]string `json:"envVars,omitempty"`
	DefaultUser    string            `json:"defaultUser,omitempty"`
	DefaultWorkdir string            `json:"defaultWorkdir,omitempty"`
	// Path replaces the default PATH (forkbox's own field: a spare
	// sandbox learns its template's PATH when it takes its files).
	Path string `json:"path,omitempty"`
	// CodeWarm starts the code-execution service's default Python kernel
	// now (forkbox's own field: Config.CodeWarm for a sandbox that was
	// started before it was asked for).
	CodeWarm bool `json:"codeWarm,omitempty"`
}

// StageReply is the answer of the agent's POST /stage: the staged input's
// id (for ScriptHeader or StdinHeader) and its size in bytes.
type StageReply struct {
	ID   string `json:"id"`
	Size int64  `json:"size"`
}

// PrepareRequest is the body of the agent's POST /snapshot/prepare: the
// agent stops listening so that its sandbox can be checkpointed, and
// waits for a ResumeFile in the control file (ControlEnv).
type PrepareRequest struct {
	// Generation identifies this snapshot; the ResumeFile that ends it
	// must carry the same one. It is > 0 and grows with each snapshot.
	Generation uint64 `json:"generation"`
}

// ResumeFile is the JSON the daemon writes to the control file to end a
// prepare: the agent takes it when its Generation is the prepared one, or
// 0 (a daemon restarted mid-snapshot that no longer knows it).
type ResumeFile struct {
	Generation uint64 `json:"generation"`
	// Hostname, when set, becomes the sandbox's hostname (a clone's own).
	Hostname string `json:"hostname,omitempty"`
}
