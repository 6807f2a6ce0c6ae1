package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/jsonstream"
)

// The daemon runs in this test process, so the process's resident memory
// is the daemon's (plus the test's own, which streams its bodies and
// answers and so stays small). daemonRSSBound is the growth of the peak
// resident set that parallel exec loads may cause: the daemon streams exec
// bodies to the agent and JSON-mode output from it, holding a few buffers
// per exec, never a body or an output.
const daemonRSSBound = 64 << 20

// measureRSS runs load and returns how far the process's peak resident
// set grew over its resident set before (the kernel's high-water mark,
// reset first through clear_refs).
func measureRSS(t *testing.T, load func()) int64 {
	t.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	before := resetPeakRSS(t) // hostile_storage_test.go
	load()
	return peakRSS(t) - before
}

// initPid returns the host pid of session id's agent.
func initPid(t *testing.T, id string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(env.dataDir, "sandboxes", id, "init.pid"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// assertSurvived fails t unless session id still runs with the agent it
// had (agentPid) and still runs commands.
func assertSurvived(t *testing.T, id, agentPid string) {
	t.Helper()
	s, err := env.c.GetSession(ctxFor(t, time.Minute), id)
	if err != nil || s.State != "running" {
		t.Fatalf("session after the load: %+v %v", s, err)
	}
	if now := initPid(t, id); now != agentPid {
		t.Fatalf("the agent was replaced (pid %s, was %s)", now, agentPid)
	}
	if out := sh(t, id, "echo alive"); out != "alive\n" {
		t.Fatalf("exec after the load: %q", out)
	}
}

// execBody is an exec request body streamed from generated data: prefix,
// then n filler bytes, then suffix. Only its small ends are ever held.
func execBody(prefix string, n int64, filler byte, suffix string) (io.Reader, int64) {
	r := io.MultiReader(strings.NewReader(prefix), io.LimitReader(byteRepeater(filler), n), strings.NewReader(suffix))
	return r, int64(len(prefix)) + n + int64(len(suffix))
}

type byteRepeater byte

func (b byteRepeater) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(b)
	}
	return len(p), nil
}

// postExec posts a generated exec body (made afresh for each try by mk)
// with Accept accept, retrying while the daemon answers 429 with
// Retry-After (in-flight exec bytes over a bound), and hands the final
// response to read. It returns how many 429s it got.
func postExec(ctx context.Context, id, accept string, mk func() (io.Reader, int64), read func(*http.Response) error) (int, error) {
	refused := 0
	for {
		body, size := mk()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, env.d.URL+"/v1/sessions/"+id+"/exec", body)
		if err != nil {
			return refused, err
		}
		req.ContentLength = size
		req.Header.Set("Authorization", "Bearer "+env.key)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", accept)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return refused, err
		}
		if resp.StatusCode == http.StatusTooManyRequests {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			after, err := strconv.Atoi(resp.Header.Get("Retry-After"))
			if err != nil || after < 1 || !strings.Contains(string(b), "/problems/exec-inflight-exceeded") {
				return refused, fmt.Errorf("429 without Retry-After or its problem type: %q %s", resp.Header.Get("Retry-After"), b)
			}
			refused++
			select {
			case <-time.After(time.Duration(after) * time.Second):
				continue
			case <-ctx.Done():
				return refused, ctx.Err()
			}
		}
		err = read(resp)
		resp.Body.Close()
		return refused, err
	}
}

// readSSEResult reads an exec event stream and returns its stdout and the
// exit event's exit code; output beyond 1 MiB is counted, not kept.
func readSSEResult(resp *http.Response) (string, int, error) {
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return "", 0, fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var event, out string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = line[len("event: "):]
		case strings.HasPrefix(line, "data: "):
			data := line[len("data: "):]
			switch event {
			case "stdout":
				b, err := base64.StdEncoding.DecodeString(data)
				if err != nil {
					return "", 0, err
				}
				if len(out) < 1<<20 {
					out += string(b)
				}
			case "exit":
				var res client.ExecResult
				if err := json.Unmarshal([]byte(data), &res); err != nil {
					return "", 0, err
				}
				return out, res.ExitCode, nil
			case "error":
				return "", 0, fmt.Errorf("error event: %s", data)
			}
		}
	}
	return "", 0, fmt.Errorf("stream ended without an exit event (%v)", sc.Err())
}

// TestHostileParallelLargeExecBodies sends 16 exec bodies of 31 MiB at
// once (half a 31 MiB command text, half 23 MiB of stdin) to one session.
// They used to be buffered whole, several times over, in the daemon (16 of
// them took it from 227 MB to 1.6 GB) and again in the agent, which the
// kernel then killed for memory, ending the session with reason error.
// Now every command runs, the daemon's peak resident set grows by less
// than daemonRSSBound, and the session and its agent survive.
func TestHostileParallelLargeExecBodies(t *testing.T) {
	s := newSession(t, client.CreateRequest{MemoryMB: 1024})
	agentPid := initPid(t, s.ID)
	const n, size = 16, 31 << 20
	stdinRaw := int64(size / 4 * 3)
	var refused int
	var mu sync.Mutex
	growth := measureRSS(t, func() {
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				mk := func() (io.Reader, int64) {
					return execBody(`{"cmd":"# `, size, 'x', `\necho cmd-`+strconv.Itoa(i)+`"}`)
				}
				want := "cmd-" + strconv.Itoa(i) + "\n"
				if i%2 == 1 {
					// 23 MiB of stdin: "aaaa" is base64 of 3 bytes 0x69 0xa6 0x9a.
					mk = func() (io.Reader, int64) {
						return execBody(`{"argv":["wc","-c"],"stdin":"`, stdinRaw/3*4, 'a', `"}`)
					}
					want = strconv.FormatInt(stdinRaw, 10) + "\n"
				}
				r, err := postExec(ctxFor(t, 5*time.Minute), s.ID, "text/event-stream", mk, func(resp *http.Response) error {
					out, code, err := readSSEResult(resp)
					if err == nil && (code != 0 || out != want) {
						err = fmt.Errorf("exit %d, stdout %q, want %q", code, truncate(out, 80), want)
					}
					return err
				})
				mu.Lock()
				refused += r
				mu.Unlock()
				if err != nil {
					errs <- fmt.Errorf("exec %d: %v", i, err)
				}
			}(i)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
	t.Logf("16 parallel 31 MiB exec bodies: peak resident set grew %d MiB (bound %d MiB); %d answers were 429 and retried",
		growth>>20, daemonRSSBound>>20, refused)
	if growth > daemonRSSBound {
		t.Errorf("the daemon's peak resident set grew by %d MiB, over the bound of %d MiB", growth>>20, daemonRSSBound>>20)
	}
	assertSurvived(t, s.ID, agentPid)
}

// jsonOutput is what readJSONOutput learns from a JSON-mode exec answer
// without holding its output: the decoded sizes and the result fields.
type jsonOutput struct {
	stdout, stderr     int64
	exitCode           int
	truncOut, truncErr bool
}

// readJSONOutput walks a JSON-mode exec answer with a streaming decoder,
// counting the decoded bytes of stdout and stderr instead of keeping them.
func readJSONOutput(resp *http.Response) (jsonOutput, error) {
	var o jsonOutput
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return o, fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	d := jsonstream.NewDecoder(resp.Body)
	if err := d.Begin(); err != nil {
		return o, err
	}
	for {
		k, ok, err := d.Key()
		if err != nil {
			return o, err
		}
		if !ok {
			return o, d.End()
		}
		switch k {
		case "stdout", "stderr":
			pr, pw := io.Pipe()
			counted := make(chan int64, 1)
			go func() {
				n, _ := io.Copy(io.Discard, base64.NewDecoder(base64.StdEncoding, pr))
				counted <- n
			}()
			_, err := d.String(pw)
			pw.CloseWithError(err)
			if err != nil {
				return o, err
			}
			if k == "stdout" {
				o.stdout = <-counted
			} else {
				o.stderr = <-counted
			}
		default:
			raw, err := d.Raw(1 << 10)
			if err != nil {
				return o, err
			}
			switch k {
			case "exit_code":
				err = json.Unmarshal(raw, &o.exitCode)
			case "stdout_truncated":
				err = json.Unmarshal(raw, &o.truncOut)
			case "stderr_truncated":
				err = json.Unmarshal(raw, &o.truncErr)
			}
			if err != nil {
				return o, err
			}
		}
	}
}

// TestHostileParallelJSONExecs runs 8 JSON-mode execs at once that each
// print 16 MiB on stdout and 16 MiB on stderr, the most a JSON result
// holds. Their output used to be collected in the daemon and marshalled
// there (8 of them took it from 66 MB to 1.3 GB); now the agent holds it,
// in the sandbox's own memory, until the command ends, and the daemon
// streams it into the answer. Every answer is whole, the daemon's peak
// resident set grows by less than daemonRSSBound, and the session lives.
func TestHostileParallelJSONExecs(t *testing.T) {
	s := newSession(t, client.CreateRequest{MemoryMB: 1024})
	agentPid := initPid(t, s.ID)
	const n, size = 8, 16 << 20
	cmd := fmt.Sprintf(`{"cmd":"head -c %d /dev/zero | tr '\\0' o; head -c %d /dev/zero | tr '\\0' e >&2"}`, size, size)
	growth := measureRSS(t, func() {
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := 0; i < n; i++ {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				mk := func() (io.Reader, int64) { return bytes.NewReader([]byte(cmd)), int64(len(cmd)) }
				_, err := postExec(ctxFor(t, 5*time.Minute), s.ID, "application/json", mk, func(resp *http.Response) error {
					o, err := readJSONOutput(resp)
					if err == nil && (o.exitCode != 0 || o.stdout != size || o.stderr != size || o.truncOut || o.truncErr) {
						err = fmt.Errorf("result %+v, want exit 0 and %d bytes of each, not truncated", o, size)
					}
					return err
				})
				if err != nil {
					errs <- fmt.Errorf("exec %d: %v", i, err)
				}
			}(i)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})
	t.Logf("8 parallel JSON-mode execs of 2 x 16 MiB: peak resident set grew %d MiB (bound %d MiB)", growth>>20, daemonRSSBound>>20)
	if growth > daemonRSSBound {
		t.Errorf("the daemon's peak resident set grew by %d MiB, over the bound of %d MiB", growth>>20, daemonRSSBound>>20)
	}
	assertSurvived(t, s.ID, agentPid)
}

// TestHostileExecInflightBound holds one tenant's exec bodies in flight
// (eight 31 MiB bodies that arrive slowly) and shows that its next exec is
// refused at once with 429 exec-inflight-exceeded and Retry-After, before
// any of its body is read, while another tenant's execs still run; when
// the bodies are gone the tenant runs commands again.
func TestHostileExecInflightBound(t *testing.T) {
	_, keyA, ca := newTenant(t, env.c, "inflight-a", client.TenantPolicy{})
	_, _, cb := newTenant(t, env.c, "inflight-b", client.TenantPolicy{})
	ctx := ctxFor(t, 3*time.Minute)
	sa, _, err := ca.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	sb, _, err := cb.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	const size = 31 << 20
	post := func(key, id string, body io.Reader, n int64, expect bool) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, env.d.URL+"/v1/sessions/"+id+"/exec", body)
		if err != nil {
			return nil, err
		}
		req.ContentLength = n
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		if expect {
			// The body goes out only once the daemon reads it.
			req.Header.Set("Expect", "100-continue")
		}
		return http.DefaultClient.Do(req)
	}
	// Eight slow bodies: 8 x (31 MiB + the exec's allowance) is just
	// under the default per-tenant bound of 256 MiB. A slow one the daemon
	// answers before the test lets go of it was refused while a probe below
	// held part of the bound (on a loaded host the probes can overtake the
	// slow ones' admission): it is sent again, so that eight end up held.
	var (
		slowMu sync.Mutex
		slow   []*io.PipeWriter
		over   bool
		wg     sync.WaitGroup
	)
	letGo := func(why string) {
		slowMu.Lock()
		over = true
		for _, pw := range slow {
			pw.CloseWithError(errors.New(why))
		}
		slowMu.Unlock()
		wg.Wait()
	}
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				pr, pw := io.Pipe()
				slowMu.Lock()
				if over {
					slowMu.Unlock()
					return
				}
				slow = append(slow, pw)
				slowMu.Unlock()
				go pw.Write([]byte(`{"cmd":"# `)) // (ends when the pipe is closed)
				if resp, err := post(keyA, sa.ID, pr, size, false); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				pr.Close()
			}
		}()
	}
	defer letGo("test over")
	var refusal *http.Response
	var refusalBody []byte
	deadline := time.Now().Add(time.Minute)
	for refusal == nil && time.Now().Before(deadline) {
		body, n := execBody(`{"cmd":"# `, size, 'x', `\necho probe"}`)
		resp, err := post(keyA, sa.ID, body, n, true)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			refusal, refusalBody = resp, b
		} else {
			time.Sleep(50 * time.Millisecond) // the slow ones are not all admitted yet
		}
	}
	if refusal == nil {
		t.Fatal("a ninth 31 MiB exec of the tenant was never refused")
	}
	if ra, err := strconv.Atoi(refusal.Header.Get("Retry-After")); err != nil || ra < 1 ||
		problemType(refusalBody) != "/problems/exec-inflight-exceeded" || refusal.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("refusal: Retry-After %q, %s", refusal.Header.Get("Retry-After"), refusalBody)
	}
	// Another tenant is not held up by this one's bodies.
	var out bytes.Buffer
	if res, err := cb.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "echo other tenant"}, &out, nil); err != nil || res.ExitCode != 0 || out.String() != "other tenant\n" {
		t.Fatalf("the other tenant's exec: %+v %v %q", res, err, out.String())
	}
	letGo("client gave up")
	out.Reset()
	if res, err := ca.Exec(ctx, sa.ID, client.ExecRequest{Cmd: "echo again"}, &out, nil); err != nil || res.ExitCode != 0 || out.String() != "again\n" {
		t.Fatalf("the tenant's exec once its bodies were gone: %+v %v %q", res, err, out.String())
	}
}

// lowerOwnOOMScore sets this process's oom_score_adj (the daemon's, in
// these tests) to score < 0 and restores it when t ends. It reports false
// when the process may not (lowering needs CAP_SYS_RESOURCE, which some
// hosts, containers among them, do not give even to root).
func lowerOwnOOMScore(t *testing.T, score int) bool {
	t.Helper()
	old, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile("/proc/self/oom_score_adj", []byte(strconv.Itoa(score)), 0); err != nil {
		return false
	}
	t.Cleanup(func() { _ = os.WriteFile("/proc/self/oom_score_adj", old, 0) })
	return true
}

// TestHostileMemoryHogDiesNotTheAgent proves the kernel's OOM killer takes
// the command that eats the sandbox's memory, not the agent (the sandbox's
// init, whose death ends the session): commands run with oom_score_adj
// 1000 and cannot lower it below the agent's 0. Where this process may
// lower its own score, it runs the daemon at -300 too: the runtime pins
// the agent at 0 instead of handing the daemon's score down (and with it
// the right of every command to go as low).
func TestHostileMemoryHogDiesNotTheAgent(t *testing.T) {
	need(t)
	if !lowerOwnOOMScore(t, -300) {
		t.Log("this host gives no CAP_SYS_RESOURCE: the daemon keeps its score of 0 (the spec's pin is covered by runtime/runc's unit test)")
	}
	s := newSession(t, client.CreateRequest{MemoryMB: 128})
	agentPid := initPid(t, s.ID)
	if b, err := os.ReadFile("/proc/" + agentPid + "/oom_score_adj"); err != nil || strings.TrimSpace(string(b)) != "0" {
		t.Fatalf("the agent's oom_score_adj is %q (%v), want 0", b, err)
	}
	// The agent sets a command's score just after it starts: the probe
	// waits for it (up to 5 s) before its first fork, a known window.
	const probe = "i=0; while [ \"$(cat /proc/$$/oom_score_adj)\" != 1000 ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done; " +
		"cat /proc/self/oom_score_adj; echo -1 > /proc/self/oom_score_adj 2>/dev/null && echo lowered || echo refused; " +
		"echo 0 > /proc/self/oom_score_adj; cat /proc/self/oom_score_adj"
	for _, user := range []string{"", "root"} {
		_, out, _ := run(t, s.ID, client.ExecRequest{User: user, Cmd: probe})
		if got := strings.Join(strings.Fields(out), " "); got != "1000 refused 0" {
			t.Fatalf("user %q: a command's score, lowering it below the agent's, to the agent's: %q; want 1000 refused 0", user, got)
		}
	}
	res, _, _ := run(t, s.ID, client.ExecRequest{Argv: []string{"python3", "-c", "b = bytearray(1 << 30)"}})
	if !res.OOMKilled {
		t.Fatalf("the hog: %+v, want oom_killed", res)
	}
	assertSurvived(t, s.ID, agentPid)
}

// TestHostileExecBodyBadInput sends malformed exec bodies, short and long
// (long command texts and stdin are passed into the sandbox while they
// arrive): each is a 400 naming the field at fault, nothing of it runs
// (not even when the fault comes after a long command text), and the
// audit hash of a long command is the one of its words.
func TestHostileExecBodyBadInput(t *testing.T) {
	s := newSession(t, client.CreateRequest{})
	long := strings.Repeat("p", 200<<10)
	okStdin := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 150<<10))
	for _, c := range []struct{ body, field, reason string }{
		{`{"cmd":"touch /tmp/ran","bogus":1}`, "bogus", "unknown field"},
		{`{"Cmd":"touch /tmp/ran"}`, "Cmd", "unknown field"},
		{`{"cmd":7}`, "cmd", "must be a string"},
		{`{"argv":"ls"}`, "argv", "must be an array"},
		{`{"timeout_s":"soon","cmd":"touch /tmp/ran"}`, "timeout_s", "must be an integer"},
		{`{"cmd":"touch /tmp/ran","cmd":"true"}`, "cmd", "given twice"},
		{`{"cmd":"touch /tmp/ran"`, "body", "truncated"},
		{``, "body", "empty"},
		{`[]`, "body", "malformed JSON"},
		{`{"cmd":"touch /tmp/ran"} {}`, "body", "data after"},
		{`{"argv":["cat"],"stdin":"@@@@"}`, "stdin", "base64"},
		{`{"cmd":"touch /tmp/ran # ` + long + `\u0000"}`, "cmd", "NUL"},
		{`{"cmd":"touch /tmp/ran # ` + long + `","user":}`, "body", "malformed JSON"},
		{`{"cmd":"touch /tmp/ran","stdin":"` + okStdin + `@"}`, "stdin", "base64"},
		{`{"cmd":"touch /tmp/ran # ` + long + `","stdin":"` + okStdin + `","bogus":true}`, "bogus", "unknown field"},
		{`{"argv":["touch","/tmp/ran","` + strings.Repeat("a", 1<<20) + `"]}`, "argv", "larger than"},
	} {
		status, hdr, b := rawCallAt(t, env.d.URL, env.key, "POST", "/v1/sessions/"+s.ID+"/exec", c.body, nil)
		var p client.Error
		_ = json.Unmarshal(b, &p)
		if status != http.StatusBadRequest || hdr.Get("Content-Type") != "application/problem+json" || p.Field != c.field || !strings.Contains(p.Detail, c.reason) {
			t.Errorf("%.60q: %d field %q %q; want 400 naming %q (...%s...)", c.body, status, p.Field, p.Detail, c.field, c.reason)
		}
	}
	if out := sh(t, s.ID, "ls /tmp/ran 2>&1 || true"); !strings.Contains(out, "No such file") {
		t.Fatalf("a refused exec ran: %q", out)
	}
	// A long command and long stdin, and the command's audit hash.
	cmd := "wc -c # " + long
	status, _, b := rawCallAt(t, env.d.URL, env.key, "POST", "/v1/sessions/"+s.ID+"/exec",
		`{"cmd":`+strconv.Quote(cmd)+`,"stdin":"`+okStdin+`","cmd_unused":null}`, map[string]string{"Accept": "application/json"})
	if status != http.StatusBadRequest || !strings.Contains(string(b), "cmd_unused") {
		t.Fatalf("unknown member after long ones: %d %s", status, b)
	}
	out, err := env.c.ExecCollect(ctxFor(t, time.Minute), s.ID, client.ExecRequest{Cmd: cmd, Stdin: bytes.Repeat([]byte{7}, 150<<10)})
	if err != nil || strings.TrimSpace(string(out.Stdout)) != strconv.Itoa(150<<10) {
		t.Fatalf("long command with long stdin: %v %q", err, out.Stdout)
	}
	list, err := env.c.Audit(ctxFor(t, time.Minute), client.AuditFilter{Session: s.ID, Kind: "exec.start", Limit: 100})
	if err != nil || len(list.Records) == 0 {
		t.Fatalf("audit: %v %+v", err, list)
	}
	sum := sha256.Sum256([]byte("/bin/sh\x00-c\x00" + cmd))
	last := list.Records[len(list.Records)-1]
	if last.Detail["command_sha256"] != hex.EncodeToString(sum[:]) || last.Detail["stdin_bytes"] != float64(150<<10) {
		t.Fatalf("exec.start record of the long command: %+v", last.Detail)
	}
}
