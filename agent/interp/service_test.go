package interp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// testPath is the PATH of the test interpreters: the system's python3
// (with Debian's ipykernel), bash and node.
const testPath = "/usr/bin:/bin"

// plainLauncher starts processes directly (the tests are not pid 1, so
// the standard library's wait works).
type plainLauncher struct{ dir string }

func (l plainLauncher) Launch(argv []string, env map[string]string, dir string, files []*os.File) (int, <-chan struct{}, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	if p, err := exec.LookPath(filepath.Join("/usr/bin", argv[0])); err == nil {
		cmd.Path = p
	}
	cmd.Dir = dir
	cmd.Env = []string{"PATH=" + testPath, "HOME=" + l.dir}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		return 0, nil, err
	}
	defer null.Close()
	fds := make([]*os.File, len(files))
	for i, f := range files {
		if f == nil {
			f = null
		}
		fds[i] = f
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = fds[0], fds[1], fds[2]
	cmd.ExtraFiles = fds[3:]
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	return cmd.Process.Pid, exited, nil
}

func (l plainLauncher) Workdir() string { return l.dir }

func (l plainLauncher) Identity() string { return l.dir }

func (l plainLauncher) Env() map[string]string { return map[string]string{"FB_SESSION": "s"} }

// need skips (or under CI fails) a test when the interpreters are not
// installed.
func need(t *testing.T, what string, check ...string) {
	t.Helper()
	if err := exec.Command(check[0], check[1:]...).Run(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%s missing (the install script installs it): %v", what, err)
		}
		t.Skipf("%s missing (scripts/install-deps.sh installs it): %v", what, err)
	}
}

func needPython(t *testing.T) {
	need(t, "python3-ipykernel, python3-jupyter-client, python3-matplotlib or python3-pandas",
		"/usr/bin/python3", "-c", "import ipykernel, jupyter_client, matplotlib, pandas")
}

// server is a code-execution service behind a test HTTP server.
type server struct {
	t   *testing.T
	svc *Service
	url string
	dir string
}

func newServer(t *testing.T) *server {
	dir := t.TempDir()
	svc := NewService(plainLauncher{dir: dir})
	ts := httptest.NewServer(svc.Handler("/code"))
	t.Cleanup(func() {
		ts.Close()
		svc.Close()
	})
	return &server{t: t, svc: svc, url: ts.URL + "/code", dir: dir}
}

// call sends method path with body as JSON and returns the status and the
// body.
func (s *server) call(method, path string, body any) (int, string) {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.url+path, rd)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// execution is what an /execute stream carried.
type execution struct {
	lines  []map[string]any
	stdout string
	stderr string
}

func (e *execution) of(typ string) []map[string]any {
	var out []map[string]any
	for _, m := range e.lines {
		if m["type"] == typ {
			out = append(out, m)
		}
	}
	return out
}

// main returns the main result's text ("" when none).
func (e *execution) main() string {
	for _, m := range e.of("result") {
		if m["is_main_result"] == true {
			s, _ := m["text"].(string)
			return s
		}
	}
	return ""
}

// errorName returns the error line's name ("" when none).
func (e *execution) errorName() string {
	if errs := e.of("error"); len(errs) > 0 {
		s, _ := errs[0]["name"].(string)
		return s
	}
	return ""
}

// run executes body and reads the stream to its end; each line is passed
// to onLine (nil: none) as it arrives.
func (s *server) run(ctx context.Context, body map[string]any, onLine func(map[string]any)) *execution {
	s.t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/execute", bytes.NewReader(b))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		s.t.Fatalf("execute: %d %s", resp.StatusCode, msg)
	}
	e := &execution{}
	br := bufio.NewReaderSize(resp.Body, 1<<20)
	for {
		line, err := readLine(br)
		if err != nil {
			if ctx.Err() != nil {
				return e
			}
			s.t.Fatalf("stream ended without end_of_execution: %v (%d lines)", err, len(e.lines))
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			s.t.Fatalf("bad line %q: %v", line, err)
		}
		switch m["type"] {
		case "end_of_execution":
			return e
		case "stdout":
			if len(e.stdout) < 1<<20 {
				e.stdout += m["text"].(string)
			}
		case "stderr":
			if len(e.stderr) < 1<<20 {
				e.stderr += m["text"].(string)
			}
		}
		if m["type"] != "stdout" || len(e.lines) < 64 {
			e.lines = append(e.lines, m)
		}
		if onLine != nil {
			onLine(m)
		}
	}
}

// exec runs code in the given context or language and returns its
// execution.
func (s *server) exec(code string, where map[string]any) *execution {
	body := map[string]any{"code": code}
	for k, v := range where {
		body[k] = v
	}
	return s.run(context.Background(), body, nil)
}

// TestPythonState runs cells in the default Python context: state kept,
// the last value as the main result, stdout and stderr, an exception as
// an error line, execution counts, %magic and a call's env_vars.
func TestPythonState(t *testing.T) {
	needPython(t)
	s := newServer(t)
	e := s.exec("x = 41\nprint('out')\nimport sys; print('err', file=sys.stderr)", nil)
	if e.stdout != "out\n" || e.stderr != "err\n" || e.errorName() != "" {
		t.Fatalf("first cell: %+v", e)
	}
	if n := e.of("number_of_executions"); len(n) != 1 || n[0]["execution_count"] != 1.0 {
		t.Errorf("execution count: %v", n)
	}
	if got := s.exec("x + 1", nil).main(); got != "42" {
		t.Errorf("x + 1 = %q, want 42", got)
	}
	e = s.exec("def f():\n    raise ValueError('bad value')\nf()", nil)
	errs := e.of("error")
	if len(errs) != 1 || errs[0]["name"] != "ValueError" || errs[0]["value"] != "bad value" || !strings.Contains(errs[0]["traceback"].(string), "bad value") {
		t.Errorf("error lines: %v", errs)
	}
	if e := s.exec("%time y = 2", nil); e.errorName() != "" || !strings.Contains(e.stdout, "Wall time") {
		t.Errorf("%%time: %+v", e)
	}
	e = s.exec("import os; os.environ.get('FB_A')", map[string]any{"env_vars": map[string]string{"FB_A": "one"}})
	if e.main() != "one" {
		t.Errorf("env_vars: main result %q", e.main())
	}
	if got := s.exec("import os; os.environ.get('FB_A', 'unset')", nil).main(); got != "unset" {
		t.Errorf("env_vars stayed after their call: %q", got)
	}
	if got := s.exec("os.environ.get('FB_SESSION')", nil).main(); got != "s" {
		t.Errorf("the session's environment in the kernel: %q", got)
	}
	if e := s.exec("print(", nil); e.errorName() != "SyntaxError" {
		t.Errorf("syntax error: %v", e.lines)
	}
}

// TestPythonStreams checks that stdout reaches the client while the cell
// still runs: the cell waits for a file the test writes only after it has
// read the first line.
func TestPythonStreams(t *testing.T) {
	needPython(t)
	s := newServer(t)
	flag := filepath.Join(s.dir, "go-on")
	code := fmt.Sprintf("import os, time\nprint('first', flush=True)\nwhile not os.path.exists(%q):\n    time.sleep(0.05)\nprint('second')", flag)
	sawFirst := false
	e := s.run(context.Background(), map[string]any{"code": code}, func(m map[string]any) {
		if m["type"] == "stdout" && m["text"] == "first\n" {
			sawFirst = true
			if err := os.WriteFile(flag, nil, 0o644); err != nil {
				t.Error(err)
			}
		}
	})
	if !sawFirst || e.stdout != "first\nsecond\n" {
		t.Errorf("stdout %q (first seen during the cell: %v)", e.stdout, sawFirst)
	}
}

// TestPythonDisplay checks rich results: a line plot's and a bar plot's
// PNG with their chart JSON, a pandas DataFrame's HTML, display().
func TestPythonDisplay(t *testing.T) {
	needPython(t)
	s := newServer(t)
	e := s.exec("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [4, 5, 6], label='a')\nplt.title('Line')\nplt.xlabel('x')\nplt.show()", nil)
	res := e.of("result")
	if len(res) != 1 || res[0]["png"] == nil {
		t.Fatalf("line plot: %v", e.lines)
	}
	chart, _ := res[0]["chart"].(map[string]any)
	if chart["type"] != "line" || chart["title"] != "Line" || chart["x_label"] != "x" {
		t.Errorf("line chart: %v", chart)
	}
	e = s.exec("fig, ax = plt.subplots()\nax.bar(['a', 'b'], [3, 4])\nax.set_title('Bars')\nfig", nil)
	res = e.of("result")
	if len(res) == 0 {
		t.Fatalf("bar plot: %v", e.lines)
	}
	chart, _ = res[len(res)-1]["chart"].(map[string]any)
	if chart["type"] != "bar" || chart["title"] != "Bars" {
		t.Errorf("bar chart: %v", chart)
	}
	e = s.exec("import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})\ndf", nil)
	if res := e.of("result"); len(res) != 1 || !strings.Contains(fmt.Sprint(res[0]["html"]), "<table") {
		t.Errorf("DataFrame: %v", e.lines)
	}
	if got := s.exec("df.a.sum()", nil).main(); got != "3" {
		t.Errorf("df.a.sum() = %q", got)
	}
	e = s.exec("from IPython.display import display, HTML\ndisplay(HTML('<b>hi</b>'))", nil)
	if res := e.of("result"); len(res) != 1 || res[0]["html"] != "<b>hi</b>" || res[0]["is_main_result"] != false {
		t.Errorf("display: %v", e.lines)
	}
}

// TestContexts creates contexts with their own state and cwd, lists,
// restarts and deletes them, and checks the errors of bad calls.
func TestContexts(t *testing.T) {
	needPython(t)
	s := newServer(t)
	sub := filepath.Join(s.dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	var a, b Context
	code, body := s.call("POST", "/contexts", map[string]any{"cwd": "sub"})
	if code != 200 || json.Unmarshal([]byte(body), &a) != nil || a.Language != Python || a.Cwd != sub {
		t.Fatalf("create: %d %s", code, body)
	}
	code, body = s.call("POST", "/contexts", map[string]any{"language": "python"})
	if code != 200 || json.Unmarshal([]byte(body), &b) != nil || b.Cwd != s.dir {
		t.Fatalf("create: %d %s", code, body)
	}
	s.exec("v = 'in a'", map[string]any{"context_id": a.ID})
	if e := s.exec("v", map[string]any{"context_id": b.ID}); e.errorName() != "NameError" {
		t.Errorf("context b sees a's state: %v", e.lines)
	}
	if got := s.exec("import os; os.getcwd()", map[string]any{"context_id": a.ID}).main(); got != sub {
		t.Errorf("cwd of a: %q", got)
	}
	var list []Context
	code, body = s.call("GET", "/contexts", nil)
	if code != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list) != 2 {
		t.Errorf("list: %d %s", code, body)
	}
	if code, body := s.call("POST", "/contexts/"+a.ID+"/restart", nil); code != 204 {
		t.Errorf("restart: %d %s", code, body)
	}
	if e := s.exec("v", map[string]any{"context_id": a.ID}); e.errorName() != "NameError" {
		t.Errorf("state kept over a restart: %v", e.lines)
	}
	if code, _ := s.call("DELETE", "/contexts/"+a.ID, nil); code != 204 {
		t.Errorf("delete: %d", code)
	}
	for _, c := range []struct {
		method, path string
		body         any
		status       int
		want         string
	}{
		{"DELETE", "/contexts/" + a.ID, nil, 404, "Context " + a.ID + " not found"},
		{"POST", "/contexts/nope/restart", nil, 404, "Context nope not found"},
		{"POST", "/execute", map[string]any{"code": "1", "context_id": "nope"}, 404, "Context nope not found"},
		{"POST", "/execute", map[string]any{"code": "1", "context_id": b.ID, "language": "python"}, 400, "context_id and language"},
		{"POST", "/execute", map[string]any{"code": "1", "language": "cobol"}, 400, `language "cobol" is not supported; the languages are python, javascript and bash`},
		{"POST", "/execute", map[string]any{"context_id": b.ID}, 400, "code is required"},
		{"POST", "/execute", map[string]any{"code": "1", "env_vars": map[string]string{"A=B": "x"}}, 400, "env_vars"},
		{"POST", "/execute", "not an object", 400, "not a JSON object"},
		{"POST", "/contexts", map[string]any{"language": "r"}, 400, `language "r"`},
		{"POST", "/contexts", map[string]any{"cwd": "/does/not/exist"}, 400, "not an existing directory"},
	} {
		code, body := s.call(c.method, c.path, c.body)
		if code != c.status || !strings.Contains(body, c.want) {
			t.Errorf("%s %s %v: %d %q, want %d %q", c.method, c.path, c.body, code, body, c.status, c.want)
		}
	}
}

// TestPythonInterrupt cancels a cell that never ends: the kernel is
// interrupted and keeps its state. A kernel that kills itself is an error
// line, and the next call gets a new kernel.
func TestPythonInterrupt(t *testing.T) {
	needPython(t)
	s := newServer(t)
	s.exec("kept = 7", nil)
	ctx, cancel := context.WithCancel(context.Background())
	s.run(ctx, map[string]any{"code": "print('looping', flush=True)\nwhile True:\n    pass"}, func(m map[string]any) {
		if m["type"] == "stdout" {
			cancel()
		}
	})
	if got := s.exec("kept", nil).main(); got != "7" {
		t.Errorf("after an interrupt: kept = %q, want 7 (the kernel survives)", got)
	}
	e := s.exec("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", nil)
	if e.errorName() != "KernelDied" {
		t.Errorf("a killed kernel: %v", e.lines)
	}
	if got := s.exec("1 + 1", nil).main(); got != "2" {
		t.Errorf("after the kernel died: 1 + 1 = %q", got)
	}
}

// TestLargeOutput prints 100 MiB and checks it all arrives in bounded
// pieces while the service's live heap (this process's, the client's included) stays
// far below it.
func TestLargeOutput(t *testing.T) {
	needPython(t)
	s := newServer(t)
	total, biggest := 0, 0
	var peak uint64
	var ms runtime.MemStats
	s.run(context.Background(), map[string]any{"code": "import sys\nfor _ in range(100):\n    sys.stdout.write('x' * (1 << 20))"}, func(m map[string]any) {
		if m["type"] == "stdout" {
			n := len(m["text"].(string))
			total += n
			biggest = max(biggest, n)
			if total%(4<<20) < n {
				runtime.GC()
				runtime.ReadMemStats(&ms)
				peak = max(peak, ms.HeapAlloc)
			}
		}
	})
	if total != 100<<20 || biggest > 64<<10 {
		t.Errorf("printed %d bytes in pieces of at most %d, want %d in pieces of at most 64 KiB", total, biggest, 100<<20)
	}
	t.Logf("live heap peak %d KiB while 100 MiB were printed", peak>>10)
	if peak > 48<<20 {
		t.Errorf("live heap reached %d MiB while 100 MiB were printed", peak>>20)
	}
}

// TestBash runs a bash context: variables and the working directory kept
// between cells, a failing command as an error, env_vars for one call, an
// interrupt of a foreground command.
func TestBash(t *testing.T) {
	need(t, "bash", "/bin/bash", "-c", "true")
	s := newServer(t)
	var ctxBash Context
	code, body := s.call("POST", "/contexts", map[string]any{"language": "bash"})
	if code != 200 || json.Unmarshal([]byte(body), &ctxBash) != nil {
		t.Fatalf("create: %d %s", code, body)
	}
	in := map[string]any{"context_id": ctxBash.ID}
	s.exec("x=5; f() { echo \"f:$1\"; }; cd /tmp", in)
	if e := s.exec("echo \"$x\"; f 'it''s'; pwd; echo oops >&2", in); e.stdout != "5\nf:its\n/tmp\n" || e.stderr != "oops\n" {
		t.Errorf("state: stdout %q stderr %q", e.stdout, e.stderr)
	}
	if e := s.exec(`printf '%s\n' 'a\nb' "q'uote"`, in); e.stdout != "a\\nb\nq'uote\n" {
		t.Errorf("quoting: %q", e.stdout)
	}
	if e := s.exec("false", in); e.errorName() != "ExitError" {
		t.Errorf("false: %v", e.lines)
	}
	if e := s.exec("echo \"$FB_B\"", map[string]any{"context_id": ctxBash.ID, "env_vars": map[string]string{"FB_B": "b v"}}); e.stdout != "b v\n" {
		t.Errorf("env_vars: %q", e.stdout)
	}
	if e := s.exec("echo \"${FB_B-unset}\"", in); e.stdout != "unset\n" {
		t.Errorf("env_vars stayed: %q", e.stdout)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.run(ctx, map[string]any{"code": "echo started; sleep 1000", "context_id": ctxBash.ID}, func(m map[string]any) {
		if m["type"] == "stdout" {
			cancel()
		}
	})
	if e := s.exec("echo \"$x\"", in); e.stdout != "5\n" {
		t.Errorf("after an interrupt: %q %v", e.stdout, e.lines)
	}
	if e := s.exec("exit 3", in); e.errorName() != "KernelDied" {
		t.Errorf("exit: %v", e.lines)
	}
	if e := s.exec("echo again", in); e.stdout != "again\n" {
		t.Errorf("after exit: %v", e.lines)
	}
}

// TestJavaScript runs a JavaScript context: globals kept, the last value,
// console output, a thrown error, top-level await, an interrupt.
func TestJavaScript(t *testing.T) {
	need(t, "node", "/usr/bin/node", "-e", "0")
	s := newServer(t)
	js := map[string]any{"language": "javascript"}
	if e := s.exec("var a = 20; let b = 1; console.log('hi'); console.error('warn')", js); e.stdout != "hi\n" || e.stderr != "warn\n" || e.errorName() != "" {
		t.Fatalf("first cell: %+v", e)
	}
	if got := s.exec("a * 2 + b + 1", js).main(); got != "42" {
		t.Errorf("a * 2 + b + 1 = %q", got)
	}
	if e := s.exec("throw new TypeError('nope')", js); e.errorName() != "TypeError" {
		t.Errorf("throw: %v", e.lines)
	}
	if got := s.exec("await new Promise((r) => setTimeout(() => r('later'), 10))", js).main(); got != "later" {
		t.Errorf("top-level await: %q", got)
	}
	if e := s.exec("const v = await Promise.resolve(3); console.log(v)", js); e.stdout != "3\n" {
		t.Errorf("await in statements: %v", e.lines)
	}
	if got := s.exec("const os = require('os'); typeof os.hostname()", js).main(); got != "string" {
		t.Errorf("require: %q", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.run(ctx, map[string]any{"code": "console.log('spin'); while (true) {}", "language": "javascript"}, func(m map[string]any) {
		if m["type"] == "stdout" {
			cancel()
		}
	})
	if got := s.exec("a", js).main(); got != "20" {
		t.Errorf("after an interrupt: a = %q", got)
	}
}

// TestWarm starts the default kernel ahead of the first call.
func TestWarm(t *testing.T) {
	needPython(t)
	s := newServer(t)
	if err := s.svc.Warm(); err != nil {
		t.Fatal(err)
	}
	list := s.svc.List()
	if len(list) != 1 || list[0].Language != Python {
		t.Fatalf("contexts after Warm: %v", list)
	}
	if got := s.exec("1 + 1", nil).main(); got != "2" {
		t.Errorf("1 + 1 = %q", got)
	}
	if len(s.svc.List()) != 1 {
		t.Errorf("the first call made another default context: %v", s.svc.List())
	}
}

// TestHostileCells are cells that try to break their context: a bash error
// that makes bash drop the rest of its input line, an env_vars name that
// is the driver's own local, a JavaScript error whose name cannot be
// serialized, Python env_vars outside the BMP; each context still answers.
func TestHostileCells(t *testing.T) {
	needPython(t)
	need(t, "bash and node", "/usr/bin/node", "-e", "0")
	s := newServer(t)
	sh := map[string]any{"language": "bash"}
	if e := s.exec(`declare -i n; n="a b"; echo x`, sh); e.errorName() != "ExitError" {
		t.Errorf("an arithmetic error in bash: %v", e.lines)
	}
	if e := s.exec("echo after", sh); e.stdout != "after\n" {
		t.Errorf("after the arithmetic error: %v", e.lines)
	}
	s.exec("echo set", map[string]any{"language": "bash", "env_vars": map[string]string{"s": "SECRET", "OPTIND": "a b"}})
	if e := s.exec(`echo "${s-unset}"`, sh); e.stdout != "unset\n" {
		t.Errorf("env_vars s stayed after its call: %q", e.stdout)
	}
	if e := s.exec("true", map[string]any{"language": "bash", "env_vars": map[string]string{"__fb_rc": "0"}}); e.errorName() != "InvalidCode" {
		t.Errorf("an env_vars name of the driver's: %v", e.lines)
	}
	js := map[string]any{"language": "javascript"}
	s.exec("var kept = 1", js)
	if e := s.exec("const e = new Error('x'); e.name = 10n; throw e", js); e.errorName() == "" {
		t.Errorf("a BigInt error name: %v", e.lines)
	}
	if got := s.exec("kept", js).main(); got != "1" {
		t.Errorf("the node driver lost its globals: kept = %q", got)
	}
	e := s.exec("import os; (os.environ['FB_A'], os.environ['FB_B'], os.environ['FB_C'])",
		map[string]any{"env_vars": map[string]string{"FB_A": "a", "FB_B": "smile😀", "FB_C": "c"}})
	if e.main() != "('a', 'smile😀', 'c')" {
		t.Errorf("env_vars outside the BMP: %v", e.lines)
	}
	if got := s.exec("import os; os.environ.get('FB_A', 'unset')", nil).main(); got != "unset" {
		t.Errorf("env_vars stayed after their call: %q", got)
	}
}

// TestRestartStopsCell: a restart while a cell runs kills the cell (it
// ends with KernelDied) instead of waiting for it.
func TestRestartStopsCell(t *testing.T) {
	need(t, "bash", "/bin/bash", "-c", "true")
	s := newServer(t)
	var c Context
	code, body := s.call("POST", "/contexts", map[string]any{"language": "bash"})
	if code != 200 || json.Unmarshal([]byte(body), &c) != nil {
		t.Fatalf("create: %d %s", code, body)
	}
	in := map[string]any{"context_id": c.ID}
	done := make(chan *execution)
	started := make(chan struct{})
	go func() {
		done <- s.run(context.Background(), map[string]any{"code": "echo go; sleep 1000", "context_id": c.ID}, func(m map[string]any) {
			if m["type"] == "stdout" {
				close(started)
			}
		})
	}()
	<-started
	if code, body := s.call("POST", "/contexts/"+c.ID+"/restart", nil); code != 204 {
		t.Fatalf("restart: %d %s", code, body)
	}
	if e := <-done; e.errorName() != "KernelDied" {
		t.Errorf("the running cell after a restart: %v", e.lines)
	}
	if e := s.exec("echo fresh", in); e.stdout != "fresh\n" {
		t.Errorf("after the restart: %v", e.lines)
	}
}
