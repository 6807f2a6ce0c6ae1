package e2e

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// connectFrame is one envelope of the Connect protocol's streaming
// encoding: a flags byte (0x02: end of stream), a big-endian length and
// the JSON message.
func connectFrame(msg any) []byte {
	b, _ := json.Marshal(msg)
	out := make([]byte, 5, 5+len(b))
	binary.BigEndian.PutUint32(out[1:], uint32(len(b)))
	return append(out, b...)
}

// envdPTY starts `sh -c CMD` in a PTY of sandbox sb through base's envd
// proxy (envd's process.Process/Start, Connect server streaming, JSON)
// and returns what the PTY printed and the exit code.
func envdPTY(t *testing.T, base string, sb e2bSandbox, cmd string) (string, int) {
	t.Helper()
	body := connectFrame(map[string]any{
		"process": map[string]any{"cmd": "/bin/sh", "args": []string{"-c", cmd}},
		"pty":     map[string]any{"size": map[string]any{"cols": 80, "rows": 24}},
	})
	req, err := http.NewRequestWithContext(ctxFor(t, time.Minute), "POST", base+"/process.Process/Start", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
	req.Header.Set("E2b-Sandbox-Port", "49983")
	req.Header.Set("X-Access-Token", sb.EnvdAccessToken)
	req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("user:")))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("process.Process/Start through %s: %d %s", base, resp.StatusCode, b)
	}
	var out strings.Builder
	exit := -1
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(resp.Body, hdr[:]); err != nil {
			t.Fatalf("PTY stream cut: %v (output so far %q)", err, out.String())
		}
		msg := make([]byte, binary.BigEndian.Uint32(hdr[1:]))
		if _, err := io.ReadFull(resp.Body, msg); err != nil {
			t.Fatal(err)
		}
		if hdr[0]&0x02 != 0 {
			if s := string(msg); s != "{}" && strings.Contains(s, "error") {
				t.Fatalf("PTY stream ended with %s", s)
			}
			return out.String(), exit
		}
		var ev struct {
			Event struct {
				Data *struct {
					Pty []byte `json:"pty"`
				} `json:"data"`
				End *struct {
					ExitCode int `json:"exitCode"`
				} `json:"end"`
			} `json:"event"`
		}
		if err := json.Unmarshal(msg, &ev); err != nil {
			t.Fatalf("PTY event %s: %v", msg, err)
		}
		if ev.Event.Data != nil {
			out.Write(ev.Event.Data.Pty)
		}
		if ev.Event.End != nil {
			exit = ev.Event.End.ExitCode
		}
	}
}
