package v1

// TemplateBuildRequest is the "spec" part of POST
// /v1/templates/{name}/build (a multipart/form-data body whose optional
// "context" part is the build context as a tar).
type TemplateBuildRequest struct {
	// Dockerfile is the Dockerfile's text (required).
	Dockerfile string `json:"dockerfile"`
	// BuildArgs give the Dockerfile's ARGs values.
	BuildArgs map[string]string `json:"build_args,omitempty"`
	// Allow is the egress allow-list of the RUN steps' sandboxes
	// ("host:port", "*.suffix:port", CIDRs, as a session's network.allow);
	// empty: no network.
	Allow []string `json:"allow,omitempty"`
	// Isolation is the tier RUN steps run in ("runc", "gvisor"; "" the
	// daemon's default).
	Isolation string `json:"isolation,omitempty"`
	// CPU (cores), MemoryMB and DiskMB (MiB) bound each step's sandbox;
	// StepTimeoutS each RUN, in seconds (default 1800).
	CPU          float64 `json:"cpu,omitempty"`
	MemoryMB     int64   `json:"memory_mb,omitempty"`
	DiskMB       int64   `json:"disk_mb,omitempty"`
	StepTimeoutS int64   `json:"step_timeout_s,omitempty"`
	// InsecureRegistries are registries a FROM of an image may reach over
	// plain HTTP (as a pull's).
	InsecureRegistries []string `json:"insecure_registries,omitempty"`
	// ReadyCmd, when set, is the template's ready check, a shell line
	// (run with /bin/sh -c), in place of the Dockerfile's HEALTHCHECK: a
	// create from the template returns only once it exits 0 in the
	// sandbox (at most 4096 bytes; "" is refused).
	ReadyCmd *string `json:"ready_cmd,omitempty"`
	// ReadyTimeoutS bounds a create's wait for the ready check, in
	// seconds (0: HEALTHCHECK --start-period, else 30; at most 600).
	ReadyTimeoutS int64 `json:"ready_timeout_s,omitempty"`
}

// BuildEvent is the data of an event of a build's stream (Accept:
// text/event-stream):
//
//	event: step     data: BuildEvent (a step begins: step, total, line, instruction)
//	event: done     data: BuildEvent (a step ended: cached, snapshot, duration_ms)
//	event: log      data: BuildEvent (a RUN's output: stream, data)
//	event: failed   data: BuildEvent (a RUN exited non-zero: exit_code)
//	event: build    data: TemplateBuild (the end: the template made)
//	event: error    data: Problem (the end: the build failed; nothing registered)
type BuildEvent struct {
	Step        int    `json:"step,omitempty"`
	Total       int    `json:"total,omitempty"`
	Line        int    `json:"line,omitempty"`
	Instruction string `json:"instruction,omitempty"`
	Cached      bool   `json:"cached,omitempty"`
	Snapshot    string `json:"snapshot,omitempty"`
	DurationMS  int64  `json:"duration_ms,omitempty"`
	Stream      string `json:"stream,omitempty"`
	Data        string `json:"data,omitempty"`
	ExitCode    int    `json:"exit_code,omitempty"`
}

// TemplateBuild is a finished build: the template and how each step went.
type TemplateBuild struct {
	Template Template    `json:"template"`
	Steps    []BuildStep `json:"steps"`
	// Sandboxes is how many sandboxes the build made (0: fully cached).
	Sandboxes int `json:"sandboxes"`
}

// BuildStep is one step of a finished build.
type BuildStep struct {
	Step        int    `json:"step"`
	Line        int    `json:"line"`
	Instruction string `json:"instruction"`
	// Cached: the result came from the build cache; no sandbox ran it.
	Cached     bool   `json:"cached"`
	Snapshot   string `json:"snapshot,omitempty"`
	DurationMS int64  `json:"duration_ms"`
}
