package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
)

// TestE2BSDK runs the unmodified e2b JS SDK (npm e2b, pinned in
// compat/e2b/package-lock.json) against the test daemon: compat/e2b is a
// node:test suite configured only through E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY, as an E2B user would configure it.
//
// It needs Node.js 20+ and npm; `npm ci` fetches the SDK the first time (and
// whenever package-lock.json changes). Without npm, or when the registry is
// unreachable, the test skips, except under CI (CI set), where it fails.
func TestE2BSDK(t *testing.T) {
	need(t)
	dir, npm := npmSuite(t, "e2b", "e2b")

	// The SDK runs with a tenant's key (not the install's admin key): what
	// it makes is that tenant's, and its calls are audited.
	tenant, key, tc := newTenant(t, env.c, "e2b", client.TenantPolicy{EgressAllow: []string{"*"}})
	// Only our configuration: an inherited E2B_DEBUG or E2B_DOMAIN would
	// send the SDK elsewhere.
	environ := []string{
		"E2B_API_URL=" + env.d.URL,
		"E2B_SANDBOX_URL=" + env.d.URL,
		"E2B_API_KEY=" + key,
		// A name the test daemon's egress resolver knows (egress_test.go).
		"FORKBOX_E2B_ALLOWED_NAME=allowed.test",
		"FORKBOX_E2B_ALLOWED_ADDR=" + egressHost,
		// Another name it knows, which the allow-list update tests switch to.
		"FORKBOX_E2B_OTHER_NAME=other.test",
		// The daemon's --domain, which getHost(port) names (ports.test.mjs).
		"FORKBOX_E2B_DOMAIN=" + e2eDomain,
	}
	var live io.Writer
	if testing.Verbose() {
		live = os.Stdout
	}
	start := time.Now()
	out, err := runNPM(ctxFor(t, 4*time.Minute), dir, npm, environ, live, "test")
	t.Logf("e2b SDK: npm test took %s", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("e2b SDK: npm test: %v\n%s", err, out)
	}
	if !testing.Verbose() {
		t.Logf("e2b SDK: %s", summary(out))
	}
	// The SDK's calls are in the tenant's audit trail: creates through the
	// control plane, commands through the envd proxy with their hashes.
	var buf bytes.Buffer
	if err := tc.ExportAudit(ctxFor(t, time.Minute), client.AuditFilter{}, &buf); err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	hashed := 0
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var r client.AuditRecord
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		if r.Tenant != tenant {
			t.Fatalf("record of tenant %q in %s's export", r.Tenant, tenant)
		}
		kinds[r.Kind]++
		if r.Kind == "envd" && r.Detail["command_sha256"] != nil {
			hashed++
		}
	}
	if kinds["session.create"] == 0 || kinds["session.start"] == 0 || kinds["envd"] == 0 || hashed == 0 {
		t.Fatalf("the SDK run's audit records: %v (%d envd starts with a command hash)", kinds, hashed)
	}
}

// npmSuite returns the directory of the npm suite compat/name and npm's
// path, with the suite's packages installed (`npm ci` when node_modules
// lacks pkg or is older than the lock file). Without Node.js or npm, or
// when the registry is unreachable, it skips t (fails it under CI).
func npmSuite(t *testing.T, name, pkg string) (dir, npm string) {
	t.Helper()
	npm, err := exec.LookPath("npm")
	if err == nil {
		_, err = exec.LookPath("node")
	}
	if err != nil {
		skipOrFail(t, "%s: needs Node.js 20+ and npm in PATH: %v", name, err)
	}
	dir, err = filepath.Abs(filepath.Join("..", "compat", name))
	if err != nil {
		t.Fatal(err)
	}
	if stale, why := npmInstallStale(dir, pkg); stale {
		t.Logf("%s: npm ci (%s)", name, why)
		out, err := runNPM(ctxFor(t, 5*time.Minute), dir, npm, nil, nil,
			"ci", "--prefer-offline", "--no-audit", "--no-fund")
		if err != nil {
			if npmNetworkError.Match(out) {
				skipOrFail(t, "%s: npm ci could not reach the registry: %v\n%s", name, err, out)
			}
			t.Fatalf("%s: npm ci: %v\n%s", name, err, out)
		}
	}
	return dir, npm
}

// npmNetworkError matches npm's report of an unreachable registry.
var npmNetworkError = regexp.MustCompile(`\b(ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|EHOSTUNREACH|ERR_SOCKET_TIMEOUT)\b|network request to .* failed`)

// skipOrFail skips t, or fails it when running under CI, where Node.js,
// npm and the registry are expected.
func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf(format+" (CI is set, so this is a failure)", args...)
	}
	t.Skipf(format, args...)
}

// npmInstallStale tells whether node_modules must be (re)installed: npm
// writes node_modules/.package-lock.json at the end of every install, so it
// is missing after none or a failed one, and older than package-lock.json
// (or package.json) when they changed since; pkg is a package the suite
// needs, which must be in node_modules.
func npmInstallStale(dir, pkg string) (bool, string) {
	installed, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json"))
	if err != nil {
		return true, "node_modules is missing"
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil {
		return true, "node_modules/" + pkg + " is missing"
	}
	for _, f := range []string{"package-lock.json", "package.json"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			return true, err.Error()
		}
		if fi.ModTime().After(installed.ModTime()) {
			return true, f + " is newer than node_modules"
		}
	}
	return false, ""
}

// runNPM runs npm with args in dir and returns its combined output, also
// copied to live when that is not nil. extraEnv replaces every E2B_
// variable of the environment. The whole process group is killed when ctx
// ends (npm test runs node, which runs one process per test file).
func runNPM(ctx context.Context, dir, npm string, extraEnv []string, live io.Writer, args ...string) ([]byte, error) {
	cmd := exec.Command(npm, args...)
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "E2B_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, extraEnv...)
	var buf bytes.Buffer
	var w io.Writer = &buf
	if live != nil {
		w = io.MultiWriter(&buf, live)
	}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return buf.Bytes(), err
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		return buf.Bytes(), errors.Join(errors.New("timed out; killed"), ctx.Err())
	}
}

// summary returns the counts node's test reporter prints at the end.
func summary(out []byte) string {
	var parts []string
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(strings.TrimLeft(line, "#ℹ "))
		for _, k := range []string{"tests ", "pass ", "fail ", "skipped ", "duration_ms "} {
			if strings.HasPrefix(line, k) {
				parts = append(parts, line)
			}
		}
	}
	return strings.Join(parts, ", ")
}
