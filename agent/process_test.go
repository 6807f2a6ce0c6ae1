package agent

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/internal/envdpb/processpb"
)

// TestStartStreamsOutputAndExit proves the stream is start(pid), separate
// byte-exact stdout/stderr data (invalid UTF-8, a character split across
// writes) and an end event with the exit code, status and error.
func TestStartStreamsOutputAndExit(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	// \342\202\254 is the euro sign, written in two writes; \377\376 is not UTF-8.
	o := mustRun(t, c, shell(`printf 'out\377\376|\342\202'; printf 'err\300' >&2; printf '\254|end'; printf '\n\000x' >&2; exit 3`), "")
	if got, want := o.stdout.String(), "out\xff\xfe|\u20ac|end"; got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	if got, want := o.stderr.String(), "err\xc0\n\x00x"; got != want {
		t.Errorf("stderr = %q, want %q", got, want)
	}
	wantExit(t, o, 3)

	o = mustRun(t, c, command("true"), "")
	if o.stdout.Len() != 0 || o.stderr.Len() != 0 {
		t.Errorf("true printed %q %q", o.stdout.String(), o.stderr.String())
	}
	wantExit(t, o, 0)
}

// TestLargeOutputIsComplete proves that output much larger than a pipe
// buffer and than one data event arrives whole and in order.
func TestLargeOutputIsComplete(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	o := mustRun(t, c, command("seq", "1", "200000"), "")
	var want bytes.Buffer
	for i := 1; i <= 200000; i++ {
		want.WriteString(strconv.Itoa(i) + "\n")
	}
	if !bytes.Equal(o.stdout.Bytes(), want.Bytes()) {
		t.Fatalf("stdout is %d bytes, want %d", o.stdout.Len(), want.Len())
	}
	wantExit(t, o, 0)
}

// TestSignalDeath proves a process killed by a signal ends with exited
// false, exit code -1, status "signal: killed" and that status as error.
func TestSignalDeath(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	o := mustRun(t, c, shell(`kill -9 $$`), "")
	e := o.end
	if e.GetExited() || e.GetExitCode() != -1 || e.GetStatus() != "signal: killed" || e.GetError() != "signal: killed" {
		t.Fatalf("end = %v, want exited=false exit_code=-1 status and error %q", e, "signal: killed")
	}
}

// envDump parses the output of `env -0`.
func envDump(t *testing.T, o *outcome) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, kv := range strings.Split(strings.TrimSuffix(o.stdout.String(), "\x00"), "\x00") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			t.Fatalf("env -0 printed %q", kv)
		}
		env[k] = v
	}
	return env
}

// TestEnvironment proves the defaults (PATH, HOME, USER, LOGNAME), the
// sandbox env and the request's envs apply in that order of precedence,
// values arrive byte for byte, and the agent's own environment does not leak.
func TestEnvironment(t *testing.T) {
	t.Setenv("FORKBOX_TEST_LEAK", "agent-only")
	_, c := newProcessAgent(t, wire.Config{Env: map[string]string{"FROM_CFG": "cfg", "OVERRIDE": "cfg", "HOME": "/cfg-home"}})
	odd := map[string]string{
		"SPACES":  "  a  b  ",
		"EQUALS":  "x=y==z=",
		"NEWLINE": "line1\nline2\n",
		"QUOTES":  `'single' "double" \back $dollar ` + "`tick`",
		"UTF8":    "h\u00e9llo \u20ac",
		"EMPTY":   "",
	}
	req := command("env", "-0")
	req.Process.Envs = map[string]string{"OVERRIDE": "req"}
	for k, v := range odd {
		req.Process.Envs[k] = v
	}
	env := envDump(t, mustRun(t, c, req, ""))
	want := map[string]string{
		"PATH": DefaultPath, "HOME": "/cfg-home", "USER": "root", "LOGNAME": "root",
		"FROM_CFG": "cfg", "OVERRIDE": "req",
	}
	for k, v := range odd {
		want[k] = v
	}
	for k, v := range want {
		if got, ok := env[k]; !ok || got != v {
			t.Errorf("%s = %q (set %v), want %q", k, got, ok, v)
		}
	}
	if len(env) != len(want) {
		t.Errorf("environment has %d variables, want %d: %q", len(env), len(want), env)
	}

	// Without the config's HOME, HOME and USER come from the account.
	_, c = newProcessAgent(t, wire.Config{Path: "/usr/bin:/bin"})
	env = envDump(t, mustRun(t, c, command("env", "-0"), ""))
	if env["HOME"] != "/root" || env["USER"] != "root" || env["PATH"] != "/usr/bin:/bin" {
		t.Errorf("defaults: HOME=%q USER=%q PATH=%q", env["HOME"], env["USER"], env["PATH"])
	}
}

// TestEnvironmentRejectsBadNames proves an env name with '=' or a value
// with NUL is invalid_argument rather than a corrupted environment.
func TestEnvironmentRejectsBadNames(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	for _, envs := range []map[string]string{{"A=B": "x"}, {"": "x"}, {"A": "x\x00y"}} {
		req := command("true")
		req.Process.Envs = envs
		wantCode(t, startErr(t, c, req, ""), connect.CodeInvalidArgument)
	}
}

// realPath resolves symlinks in p so it compares with what pwd -P prints.
func realPath(t *testing.T, p string) string {
	t.Helper()
	r, err := filepath.EvalSymlinks(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestWorkingDirectory proves the request cwd, a cwd relative to home
// (plain and "~/"), the configured workdir and home as default; a missing
// cwd is invalid_argument.
func TestWorkingDirectory(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	pwd := func(cwd *string) string {
		t.Helper()
		req := command("pwd", "-P")
		req.Process.Cwd = cwd
		o := mustRun(t, c, req, "")
		wantExit(t, o, 0)
		return strings.TrimSuffix(o.stdout.String(), "\n")
	}
	dir := t.TempDir()
	if got := pwd(&dir); got != realPath(t, dir) {
		t.Errorf("cwd %s: pwd = %s", dir, got)
	}
	inHome, err := os.MkdirTemp("/root", "forkbox-cwd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(inHome) })
	rel := filepath.Base(inHome)
	if got := pwd(&rel); got != realPath(t, inHome) {
		t.Errorf("cwd %s: pwd = %s, want %s", rel, got, inHome)
	}
	tilde := "~/" + rel
	if got := pwd(&tilde); got != realPath(t, inHome) {
		t.Errorf("cwd %s: pwd = %s, want %s", tilde, got, inHome)
	}
	if got := pwd(nil); got != realPath(t, "/root") {
		t.Errorf("no cwd: pwd = %s, want the home /root", got)
	}

	missing := filepath.Join(dir, "missing")
	req := command("pwd")
	req.Process.Cwd = &missing
	wantCode(t, startErr(t, c, req, ""), connect.CodeInvalidArgument)

	_, c = newProcessAgent(t, wire.Config{Workdir: dir})
	o := mustRun(t, c, command("pwd", "-P"), "")
	if got := strings.TrimSuffix(o.stdout.String(), "\n"); got != realPath(t, dir) {
		t.Errorf("workdir %s: pwd = %s", dir, got)
	}
}

// TestStartErrors proves the error codes for an unknown executable
// (not_found), an unknown user (unauthenticated), an empty cmd
// (invalid_argument) and a file that is not executable (not_found).
func TestStartErrors(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	wantCode(t, startErr(t, c, command("no-such-command-forkbox"), ""), connect.CodeNotFound)
	wantCode(t, startErr(t, c, command("/no/such/path"), ""), connect.CodeNotFound)
	wantCode(t, startErr(t, c, command("true"), "nosuchuser"), connect.CodeUnauthenticated)
	wantCode(t, startErr(t, c, command(""), ""), connect.CodeInvalidArgument)
	plain := filepath.Join(t.TempDir(), "plain")
	if err := os.WriteFile(plain, []byte("echo hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	wantCode(t, startErr(t, c, command(plain), ""), connect.CodeNotFound)
}

// TestNumericUser proves a numeric user runs the process with that uid and
// the primary gid of its passwd entry (or the same number without one).
func TestNumericUser(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	acc, err := lookupAccount("1000")
	if err != nil {
		t.Fatal(err)
	}
	req := shell(`id -u; id -g`)
	root := "/"
	req.Process.Cwd = &root
	o := mustRun(t, c, req, "1000")
	wantExit(t, o, 0)
	if got, want := o.stdout.String(), "1000\n"+strconv.Itoa(int(acc.GID))+"\n"; got != want {
		t.Fatalf("id printed %q, want %q", got, want)
	}
}

// TestStdin proves stdin is a pipe when unset (SendInput data, then
// CloseStdin, reach cat byte for byte) and /dev/null when false.
func TestStdin(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	ctx := guardCtx(t)
	ev, pid := mustStart(t, ctx, c, command("cat"))
	input := []byte("hello\x00\xff world\n")
	for _, chunk := range [][]byte{input[:3], input[3:]} {
		_, err := c.SendInput(ctx, connect.NewRequest(&processpb.SendInputRequest{
			Process: pidSel(pid), Input: &processpb.ProcessInput{Input: &processpb.ProcessInput_Stdin{Stdin: chunk}},
		}))
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.CloseStdin(ctx, connect.NewRequest(&processpb.CloseStdinRequest{Process: pidSel(pid)})); err != nil {
		t.Fatal(err)
	}
	o := &outcome{pid: pid}
	if err := collectRest(ev, o); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(o.stdout.Bytes(), input) {
		t.Errorf("cat echoed %q, want %q", o.stdout.Bytes(), input)
	}
	wantExit(t, o, 0)

	no := false
	req := command("cat")
	req.Stdin = &no
	o = mustRun(t, c, req, "")
	if o.stdout.Len() != 0 || o.stderr.Len() != 0 {
		t.Errorf("cat with /dev/null printed %q %q", o.stdout.String(), o.stderr.String())
	}
	wantExit(t, o, 0)
}

// longScript returns a shell script of more than 300 KiB that prints a
// marker and its first argument and exits with 7.
func longScript() string {
	return "echo start-marker\n# " + strings.Repeat("x", 300<<10) + "\necho \"end-marker $1\"\nexit 7\n"
}

// TestLongShellScript proves a `sh -c` script above the kernel's
// per-argument limit runs (through a memfd), with its positional
// arguments, also as an unprivileged user.
func TestLongShellScript(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	script := longScript()
	if len(script) <= maxArgLen {
		t.Fatal("script is not long enough to need the memfd path")
	}
	o := mustRun(t, c, command("sh", "-c", script), "")
	if got := o.stdout.String(); got != "start-marker\nend-marker \n" {
		t.Errorf("stdout = %q (stderr %q)", got, o.stderr.String())
	}
	wantExit(t, o, 7)

	req := command("/bin/sh", "-e", "-c", script, "name", "first-arg")
	root := "/"
	req.Process.Cwd = &root
	o = mustRun(t, c, req, "1000")
	if got := o.stdout.String(); got != "start-marker\nend-marker first-arg\n" {
		t.Errorf("as uid 1000 with args: stdout = %q (stderr %q)", got, o.stderr.String())
	}
	wantExit(t, o, 7)
}

// TestLongArgumentRejected proves an over-long argument that is not a
// shell -c script, or a second long script, is invalid_argument.
func TestLongArgumentRejected(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	big := strings.Repeat("y", 300<<10)
	wantCode(t, startErr(t, c, command("echo", big), ""), connect.CodeInvalidArgument)
	wantCode(t, startErr(t, c, command(big), ""), connect.CodeInvalidArgument)
	wantCode(t, startErr(t, c, command("sh", "-c", longScript(), "-c", longScript()), ""), connect.CodeInvalidArgument)
}

// TestFitArgs proves the long-script rewrite (flags kept, $0 dropped, the
// script in a close-on-exec memfd), and that rejecting a second over-long
// argument after a rewrite neither panics nor leaves the memfd open.
func TestFitArgs(t *testing.T) {
	script := longScript()
	ls := &launchSpec{argv: []string{"bash", "-e", "-c", script, "name", "a1", "a2"}}
	if err := ls.fitArgs(); err != nil {
		t.Fatal(err)
	}
	defer ls.extra.Close()
	if got := strings.Join(ls.argv, " "); got != "bash -e /proc/self/fd/3 a1 a2" {
		t.Fatalf("argv = %q", got)
	}
	b, err := os.ReadFile("/proc/self/fd/" + strconv.Itoa(int(ls.extra.Fd())))
	if err != nil || string(b) != script {
		t.Fatalf("memfd holds %d bytes (%v), want the %d-byte script", len(b), err, len(script))
	}
	flags, err := unix.FcntlInt(ls.extra.Fd(), unix.F_GETFD, 0)
	if err != nil || flags&unix.FD_CLOEXEC == 0 {
		t.Fatalf("memfd is not close-on-exec (flags %#x, %v)", flags, err)
	}

	for _, argv := range [][]string{
		{"sh", "-c", script, "name", strings.Repeat("z", maxArgLen+1)},
		{"sh", "-c", script, "-c", script},
		{"sh", "-c", script, strings.Repeat("n", maxArgLen+1)},
	} {
		ls := &launchSpec{argv: argv}
		err := ls.fitArgs()
		if connect.CodeOf(err) != connect.CodeInvalidArgument || ls.extra != nil {
			t.Fatalf("argv of %d args: err %v, memfd %v; want invalid_argument and no memfd", len(argv), connect.CodeOf(err), ls.extra)
		}
	}
}
