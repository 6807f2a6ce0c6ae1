package wire

// Request headers forkbox adds to envd's process calls. They name inputs
// staged before the call (POST /stage, StageReply) or ask for collected
// output. They are forkbox's own: the E2B envd proxy drops every
// Forkbox-* header.
const (
	// ScriptHeader on process.Start names a staged shell script: the
	// process runs as cmd, args..., "/proc/self/fd/3" with the script at
	// fd 3 (so cmd is a shell, and no -c script is in args).
	ScriptHeader = "Forkbox-Script"
	// StdinHeader on process.Start names staged stdin data, written to the
	// process's stdin pipe before anything SendInput sends; the pipe is
	// then closed unless KeepStdinHeader is "1". On process.SendInput it
	// names data written before the message's own input.
	StdinHeader = "Forkbox-Stdin"
	// KeepStdinHeader "1" keeps the stdin pipe open after the data
	// StdinHeader names was written.
	KeepStdinHeader = "Forkbox-Keep-Stdin"
	// CollectHeader on process.Start or process.Connect asks for collected
	// output: up to the header's value in bytes (a decimal integer > 0)
	// of stdout (PTY output counts as stdout) and as much of stderr are
	// kept and sent after the process ended, stdout first, right before
	// the end event.
	CollectHeader = "Forkbox-Collect"
)

// Response trailers of process.Start and process.Connect streams that end
// with the process.
const (
	// CPUTrailer is the CPU time (user plus system) the process and the
	// children it waited for used, in milliseconds (a decimal integer).
	CPUTrailer = "Forkbox-Cpu-Ms"
	// DurationTrailer is the process's run time from its start to its
	// exit, in milliseconds (a decimal integer).
	DurationTrailer = "Forkbox-Duration-Ms"
	// TruncatedTrailer lists the streams ("stdout", "stderr", comma
	// separated) of which collected output was cut: at the limit, or
	// where the sandbox's memory had no room for more.
	TruncatedTrailer = "Forkbox-Truncated"
)

// The agent's port tunnel (GET /port/{port}): the request upgrades to
// PortUpgrade, after which the connection carries the bytes of a TCP
// connection the agent made to that port on the sandbox's loopback. A
// refusal because nothing listens there carries PortErrorHeader with
// PortNotListening, so the host can tell it from the agent's other errors.
const (
	PortUpgrade      = "forkbox-tcp"
	PortErrorHeader  = "Forkbox-Port-Error"
	PortNotListening = "not-listening"
)
