package sandbox

import (
	"testing"
	"time"
)

// TestParseLogLine proves the agent's slog text lines are read with their
// time, level, message and fields (quoted values too), and other lines are
// kept whole at the time of the line before.
func TestParseLogLine(t *testing.T) {
	prev := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := parseLogLine(`time=2026-12-02T16:50:30.123Z level=INFO msg="process started" logger=process pid=12 cmd=bash tag=""`, prev)
	if !l.Time.Equal(time.Date(2026, 12, 2, 16, 50, 30, 123e6, time.UTC)) || l.Level != "info" || l.Message != "process started" ||
		l.Fields["pid"] != "12" || l.Fields["cmd"] != "bash" || l.Fields["logger"] != "process" || l.Fields["tag"] != "" {
		t.Fatalf("slog line: %+v", l)
	}
	l = parseLogLine(`time=2026-12-02T16:50:31Z level=WARN msg="a \"quoted\" = message" err="x y"`, prev)
	if l.Level != "warn" || l.Message != `a "quoted" = message` || l.Fields["err"] != "x y" {
		t.Fatalf("quoted: %+v", l)
	}
	for _, s := range []string{"http: 2026/12/02 16:50:30 TLS handshake error", `time=oops msg="unterminated`} {
		l = parseLogLine(s, prev)
		if !l.Time.Equal(prev) || l.Level != "info" || l.Message != s {
			t.Errorf("%q: %+v, want it whole at the previous time", s, l)
		}
	}
}
