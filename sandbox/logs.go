package sandbox

import (
	"bufio"
	"context"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime/bundle"
)

// maxLogRead bounds what Logs reads of a sandbox's log file, in bytes:
// the agent caps its own writes at 1 MiB (agent/logcap.go), and the
// runtime adds a few lines of its own.
const maxLogRead = 2 << 20

// Logs returns live session id's log lines (node.Sessions.Logs): the
// guest agent's log on the host (DATA/sandboxes/ID/agent.log, written by
// the agent's slog text handler: commands started and ended, warnings),
// oldest first, those at or after since, at most limit (0: all). A line
// the agent did not write in that form (the runtime's) is kept as an info
// line at the time of the line before it. ErrNotFound, ErrTerminated as
// for any call on an unknown or ended session.
func (mt *Meter) Logs(ctx context.Context, id string, since time.Time, limit int) ([]node.LogLine, error) {
	sb := mt.m.find(ctx, id)
	if sb == nil || !isLive(sb.Record().State) {
		_, _, err := mt.m.use(ctx, id) // the right error for an ended or unknown session
		return nil, err
	}
	f, err := os.Open(filepath.Join(sb.dir, bundle.LogFile))
	if os.IsNotExist(err) {
		return []node.LogLine{}, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	started := sb.Record().StartedAt
	out := []node.LogLine{}
	sc := bufio.NewScanner(io.LimitReader(f, maxLogRead))
	sc.Buffer(make([]byte, 64<<10), 64<<10)
	last := started
	for sc.Scan() {
		line := parseLogLine(sc.Text(), last)
		if line.Message == "" {
			continue
		}
		last = line.Time
		if line.Time.Before(since) {
			continue
		}
		out = append(out, line)
	}
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// parseLogLine reads one line of slog's text format ("time=... level=INFO
// msg=\"...\" key=value ..."); any other line is an info line at time
// prev with the line as its message.
func parseLogLine(s string, prev time.Time) node.LogLine {
	s = strings.TrimSpace(s)
	l := node.LogLine{Time: prev, Level: "info", Message: s}
	if !strings.HasPrefix(s, "time=") {
		return l
	}
	kv, ok := splitLogFields(s)
	if !ok {
		return l
	}
	l.Fields = map[string]string{}
	for _, f := range kv {
		switch f[0] {
		case "time":
			if t, err := time.Parse(time.RFC3339Nano, f[1]); err == nil {
				l.Time = t.UTC()
			}
		case "level":
			l.Level = strings.ToLower(f[1])
		case "msg":
			l.Message = f[1]
		default:
			l.Fields[f[0]] = f[1]
		}
	}
	return l
}

// splitLogFields splits slog text "k=v k2=\"quoted v\"" into pairs; ok
// is false when s is not in that form.
func splitLogFields(s string) (pairs [][2]string, ok bool) {
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || strings.ContainsAny(s[:eq], " \"") {
			return nil, false
		}
		key, rest := s[:eq], s[eq+1:]
		var val string
		if strings.HasPrefix(rest, `"`) {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				return nil, false
			}
			if val, err = strconv.Unquote(q); err != nil {
				return nil, false
			}
			rest = rest[len(q):]
		} else {
			val, rest, _ = strings.Cut(rest, " ")
			rest = " " + rest
		}
		pairs = append(pairs, [2]string{key, val})
		s = strings.TrimLeft(rest, " ")
	}
	return pairs, true
}
