package agent

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/guest/wire"
)

// inPrivateEtc runs fn on an OS thread of its own whose mount namespace
// has the files passwd and group (in a temporary directory) bound over
// /etc/passwd and /etc/group, so that fn can change the account
// databases os/user reads without touching the host's. The thread is
// never given back to the Go scheduler: it ends with fn, and the
// namespace with it. It needs root; without it the test skips.
func inPrivateEtc(t *testing.T, fn func(passwd, group string)) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (a mount namespace with its own /etc/passwd)")
	}
	dir := t.TempDir()
	passwd, group := filepath.Join(dir, "passwd"), filepath.Join(dir, "group")
	for _, f := range []string{passwd, group} {
		if err := os.WriteFile(f, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
		if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
			panic("unshare: " + err.Error())
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			panic("make / private: " + err.Error())
		}
		for src, dst := range map[string]string{passwd: passwdFile, group: groupFile} {
			if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
				panic("bind " + dst + ": " + err.Error())
			}
		}
		fn(passwd, group)
	}()
	if p := <-done; p != nil {
		t.Fatal(p)
	}
}

// writeDB replaces the contents of the bound file path in place (the bind
// mount follows the inode, so a rename would not show through it).
func writeDB(path, content string) {
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		panic(err)
	}
}

// TestAccountCacheFollowsTheFiles proves the agent's account cache
// answers from memory only while /etc/passwd and /etc/group keep the
// bytes it resolved from: a uid changed in place to one of the same
// length, a group membership added and a user removed are each seen by
// the next lookup, and an unchanged database answers with the entry
// already resolved.
func TestAccountCacheFollowsTheFiles(t *testing.T) {
	inPrivateEtc(t, func(passwd, group string) {
		writeDB(passwd, "root:x:0:0:root:/root:/bin/sh\nalice:x:1001:1001::/home/alice:/bin/sh\n")
		writeDB(group, "root:x:0:\nalice:x:1001:\n")
		var c accountCache
		first, err := c.lookup("alice")
		if err != nil || first.UID != 1001 || first.Home != "/home/alice" {
			panic("alice: " + strconv.Itoa(int(first.UID)) + " " + errString(err))
		}
		if again, err := c.lookup("alice"); err != nil || again != first {
			panic("an unchanged database did not answer from the cache")
		}
		writeDB(passwd, "root:x:0:0:root:/root:/bin/sh\nalice:x:1002:1001::/home/alice:/bin/sh\n")
		if acc, err := c.lookup("alice"); err != nil || acc.UID != 1002 {
			panic("after the uid changed in place: " + errString(err))
		}
		writeDB(group, "root:x:0:\nalice:x:1001:\nwheel:x:10:alice\n")
		if acc, err := c.lookup("alice"); err != nil || len(acc.Groups) != 1 || acc.Groups[0] != 10 {
			panic("after alice joined wheel: " + errString(err))
		}
		writeDB(passwd, "root:x:0:0:root:/root:/bin/sh\n")
		if _, err := c.lookup("alice"); connect.CodeOf(err) != connect.CodeUnauthenticated {
			panic("alice after her removal: " + errString(err))
		}
	})
}

// TestStartedProcessOOMScore proves a started process (and so what it
// starts) is the OOM killer's first choice, and that its stdin without a
// pipe reads as empty (the agent's shared /dev/null) for each of two
// processes in a row. The agent sets the score just after the start, so
// for its first moment a process still has 0 (a known window, seen on a
// loaded host): the shell waits up to 5 s for the score to be set.
func TestStartedProcessOOMScore(t *testing.T) {
	_, c := newProcessAgent(t, wire.Config{})
	for range 2 {
		req := shell(`i=0; while [ "$(cat /proc/$$/oom_score_adj)" != ` + userOOMScoreAdj + ` ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i+1)); done; cat /proc/$$/oom_score_adj; cat; echo end`)
		noStdin := false
		req.Stdin = &noStdin
		o := mustRun(t, c, req, "")
		wantExit(t, o, 0)
		if got := o.stdout.String(); got != userOOMScoreAdj+"\nend\n" {
			t.Fatalf("printed %q, want the score %s and an empty stdin", got, userOOMScoreAdj)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}
