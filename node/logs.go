package node

import "time"

// LogLine is one line of a session's log (Sessions.Logs).
type LogLine struct {
	// Time is when it was written (UTC).
	Time time.Time
	// Level is "debug", "info", "warn" or "error".
	Level string
	// Message is what happened; Fields are its details (pid, exit code, ...).
	Message string
	Fields  map[string]string
}

// UsageSample is one reading of a session's resource use from outside the
// sandbox (Sessions.UsageHistory).
type UsageSample struct {
	// Time is when it was read (UTC).
	Time time.Time
	// CPUSeconds is the CPU time used since the session started.
	CPUSeconds float64
	// MemoryBytes is the memory in use then.
	MemoryBytes int64
}
