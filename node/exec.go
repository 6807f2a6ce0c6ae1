package node

import (
	"context"
	"io"
)

// ExecSpec runs one command in a session. Exactly one of Argv and Cmd is
// set, unless the command text is staged (ExecInputs.Script).
type ExecSpec struct {
	// Argv is the command and its arguments, run without a shell.
	Argv []string
	// Cmd is a shell command line, run with /bin/sh -c.
	Cmd string
	// Env is added to the sandbox's environment for this command.
	Env map[string]string
	// Cwd is the working directory (relative paths start at the user's home).
	Cwd string
	// User runs the command ("" = the session's default user).
	User string
	// TimeoutS kills the command's process group after this many seconds
	// (0: 60 s; for background commands "until the session ends").
	TimeoutS int64
	// Stdin is written to the command's stdin, which is then closed
	// unless KeepStdin. Without either, stdin is /dev/null.
	Stdin []byte
	// KeepStdin gives the command a stdin pipe that stays open.
	KeepStdin bool
	// Background returns as soon as the command started.
	Background bool
	// Tag names a background command so it can be found without its pid.
	Tag string
}

// ExecResult is how a command ended. ExitCode follows the shell
// convention: 128+N when signal N killed it.
type ExecResult struct {
	// Pid is the process id inside the sandbox.
	Pid int
	// ExitCode is the exit status, or 128+Signal after a signal death.
	ExitCode int
	// Signal is the number of the signal that killed it (0 for a normal exit).
	Signal int
	// TimedOut: forkbox killed it at its exec timeout.
	TimedOut bool
	// OOMKilled: the kernel's out-of-memory killer ended it.
	OOMKilled bool
	// DurationMS is the wall-clock run time in milliseconds.
	DurationMS int64
	// CPUMS is the CPU time (user plus system) the command and the
	// children it waited for used, in milliseconds.
	CPUMS int64
}

// Process is a running command started through exec.
type Process struct {
	Pid  int
	Tag  string
	Cmd  string
	Args []string
	Env  map[string]string
	Cwd  string
}

// Output receives a command's events in order. A returned error stops the
// exec (the command is then killed unless it is a background command).
type Output interface {
	// Started is called once with the in-sandbox pid, before any output.
	Started(pid int) error
	// Stdout and Stderr get raw output chunks; the slices are not reused.
	Stdout(p []byte) error
	Stderr(p []byte) error
}

// Collector is an Output that wants a command's output whole after it
// ended (a JSON result) rather than as it comes: the sandbox keeps up to
// CollectLimit bytes of each stream in its own memory meanwhile, so the
// caller's host never holds it. Its Stdout calls all come before its
// Stderr calls, after the command ended.
type Collector interface {
	Output
	// CollectLimit is the most bytes kept of each stream.
	CollectLimit() int64
	// Truncated reports, before the result is returned, which streams
	// were cut at the limit (or where the sandbox had no memory for more).
	Truncated(stdout, stderr bool)
}

// OutputFuncs returns an Output calling the given functions (nil ones are skipped).
func OutputFuncs(started func(pid int) error, stdout, stderr func(p []byte) error) Output {
	return outputFuncs{started: started, stdout: stdout, stderr: stderr}
}

type outputFuncs struct {
	started        func(int) error
	stdout, stderr func([]byte) error
}

func (o outputFuncs) Started(pid int) error { return call(o.started, pid) }
func (o outputFuncs) Stdout(p []byte) error { return call(o.stdout, p) }
func (o outputFuncs) Stderr(p []byte) error { return call(o.stderr, p) }

func call[T any](f func(T) error, v T) error {
	if f == nil {
		return nil
	}
	return f(v)
}

// Staged is an exec input (a command text or stdin data) held inside the
// sandbox until a command takes it; ID names it there.
type Staged struct {
	ID string
	// Size is its length in bytes.
	Size int64
}

// ExecInputs are the parts of an exec staged in the sandbox beforehand.
type ExecInputs struct {
	// Script is the shell command text (run with /bin/sh; ExecSpec.Cmd
	// and Argv are then empty).
	Script *Staged
	// Stdin is the stdin data (ExecSpec.Stdin is then empty).
	Stdin *Staged
}

// ExecCall is an exec or stdin call being set up in one session
// (Node.PrepareExec): it holds the session as a call in flight, the call's
// place in the in-flight byte budget, and the inputs it staged in the
// sandbox. Close gives all of them back. Its methods may be called from
// several goroutines.
type ExecCall interface {
	// GrowBody counts n more bytes of a body of unknown length in the
	// budget; a 429 error when the budget has no room for them.
	GrowBody(n int64) error
	// BodyDone gives back the body's bytes once it was passed on.
	BodyDone()
	// Stage copies r into the sandbox as an input a command takes later.
	Stage(ctx context.Context, r io.Reader) (Staged, error)
	// Exec runs spec (Node.Exec) with the inputs in staged instead of
	// spec.Cmd or spec.Stdin.
	Exec(ctx context.Context, spec ExecSpec, staged ExecInputs, out Output) (*ExecResult, error)
	// SendStdin writes data and then staged (either may be empty) to
	// command pid's stdin and, with closeAfter, closes it.
	SendStdin(ctx context.Context, pid int, data []byte, staged *Staged, closeAfter bool) error
	// Close ends the call; closing twice is fine.
	Close()
}
