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
