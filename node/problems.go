package node

// Problem types a Node's typed errors (errdefs.Typed) carry, so that an
// edge can name them (RFC 9457 "type" on forkbox's API). Those of
// tenant policy and admission follow the system design's section 4.3.
const (
	ProblemImageNotApproved   = "image-not-approved"
	ProblemEgressNotAllowed   = "egress-not-allowed"
	ProblemTenantConcurrency  = "tenant-concurrency-exceeded"
	ProblemCapacity           = "capacity-unavailable"
	ProblemCPUBudgetExhausted = "cpu-budget-exhausted"
	ProblemTenantQuota        = "tenant-quota-exceeded"
	ProblemTenantSuspended    = "tenant-suspended"
	// ProblemAgentFailed: the sandbox's agent failed a request (502).
	ProblemAgentFailed = "agent-failed"
	// ProblemSandboxNotReady: the agent did not come up in time (503).
	ProblemSandboxNotReady = "sandbox-not-ready"
	// ProblemExecStreamCut: a memory snapshot cut an exec or re-attach
	// stream (the command keeps running).
	ProblemExecStreamCut = "exec-stream-cut"
	// ProblemPortNotListening: nothing listens on the sandbox port a
	// request was for (502; the class is ErrUnavailable).
	ProblemPortNotListening = "port-not-listening"
	// ProblemReadyCheckFailed: a create's template ready check did not
	// pass in time; the session was destroyed (422; the class is
	// ErrInvalidArgument, the field "template").
	ProblemReadyCheckFailed = "ready-check-failed"
)

// ExecOverhead is the fixed allowance, in bytes, an exec or stdin call
// holds in the in-flight budget while it runs: the buffers it uses to
// read its body and to pass output on (a few of 32-64 KiB).
const ExecOverhead = 256 << 10

// MaxExecBody is the largest exec or stdin request body a Node takes, in
// bytes (it may carry a long command text and stdin data).
const MaxExecBody = 32 << 20
