package client_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon/daemontest"
	"github.com/forkbox/forkbox/errdefs"
)

// TestAgainstDaemon drives every client method against one real daemon
// (real runc sandboxes, real SQLite): each subtest proves a group of
// methods round-trips, and that the daemon's errors come back as the
// matching errdefs class.
func TestAgainstDaemon(t *testing.T) {
	d := daemontest.Start(t)
	c := d.Client
	t.Run("Sessions", func(t *testing.T) { testSessions(t, c) })
	t.Run("Exec", func(t *testing.T) { testExec(t, c) })
	t.Run("Files", func(t *testing.T) { testFiles(t, c) })
	t.Run("SnapshotsAndForks", func(t *testing.T) { testSnapshots(t, c) })
	t.Run("Pools", func(t *testing.T) { testPools(t, c) })
	t.Run("TenantsKeysAudit", func(t *testing.T) { testTenants(t, c, d.URL) })
	t.Run("Errors", func(t *testing.T) { testErrors(t, c, d.URL) })
}

// ctxFor bounds one test step (a hang guard, not a performance assertion).
func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newSession creates a small session and destroys it when t ends.
func newSession(t *testing.T, c *client.Client, req client.CreateRequest) *client.Session {
	t.Helper()
	if req.DiskMB == 0 {
		req.DiskMB = 256
	}
	s, _, err := c.CreateSession(ctxFor(t, 2*time.Minute), req, "")
	if err != nil {
		t.Fatalf("create session: %v", err)
	}
	t.Cleanup(func() { destroy(c, s.ID) })
	return s
}

// destroy deletes a session, ignoring the error of one already gone.
func destroy(c *client.Client, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = c.DeleteSession(ctx, id)
}

// wantClass fails t unless err is of errdefs class want and is a
// *client.Error (the daemon's problem, not a local one).
func wantClass(t *testing.T, what string, err, want error) {
	t.Helper()
	var apiErr *client.Error
	if !errors.Is(err, want) || !errors.As(err, &apiErr) {
		t.Errorf("%s: %v (%T), want a daemon error of class %v", what, err, err, want)
	}
}

func testSessions(t *testing.T, c *client.Client) {
	ctx := ctxFor(t, 3*time.Minute)
	info, err := c.Info(ctx)
	if err != nil || info.Version == "" || info.DefaultDriver == "" {
		t.Fatalf("Info: %+v, %v", info, err)
	}
	req := client.CreateRequest{MemoryMB: 256, DiskMB: 256, TimeoutS: 120, Metadata: map[string]string{"suite": "client"}}
	s, replayed, err := c.CreateSession(ctx, req, "client-test-create")
	if err != nil || replayed || s.State != "running" || s.MemoryMB != 256 {
		t.Fatalf("CreateSession: %+v replayed=%v, %v", s, replayed, err)
	}
	defer destroy(c, s.ID)
	again, replayed, err := c.CreateSession(ctx, req, "client-test-create")
	if err != nil || !replayed || again.ID != s.ID {
		t.Fatalf("CreateSession retried with the same idempotency key: %+v replayed=%v, %v; want %s replayed", again, replayed, err, s.ID)
	}
	got, err := c.GetSession(ctx, s.ID)
	if err != nil || got.ID != s.ID || got.Metadata["suite"] != "client" {
		t.Fatalf("GetSession: %+v, %v", got, err)
	}
	list, err := c.ListSessions(ctx, client.ListOptions{Metadata: map[string]string{"suite": "client"}})
	if err != nil || len(list) != 1 || list[0].ID != s.ID {
		t.Fatalf("ListSessions by label: %+v, %v", list, err)
	}
	// SetTimeout moves the end to 600 s from now (the session's timeout_s
	// stays what it was created with).
	if got, err := c.SetTimeout(ctx, s.ID, 600); err != nil || got.ExpiresAt == nil || time.Until(*got.ExpiresAt) < 500*time.Second {
		t.Fatalf("SetTimeout: %+v, %v; want it to expire in about 600 s", got, err)
	}
	if u, err := c.Usage(ctx, s.ID); err != nil || u.Pids < 1 || u.MemoryBytes <= 0 {
		t.Fatalf("Usage: %+v, %v", u, err)
	}
	if recs, err := c.Egress(ctx, s.ID, 0, 10); err != nil || len(recs) != 0 {
		t.Fatalf("Egress of a session without network: %+v, %v", recs, err)
	}
	if p, err := c.Pause(ctx, s.ID); err != nil || p.State != "paused" {
		t.Fatalf("Pause: %+v, %v", p, err)
	}
	if r, err := c.Resume(ctx, s.ID); err != nil || r.State != "running" {
		t.Fatalf("Resume: %+v, %v", r, err)
	}
	if err := c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatalf("DeleteSession: %v", err)
	}
	ended, err := c.GetSession(ctx, s.ID)
	if err != nil || ended.State != "terminated" || ended.Reason != "deleted" {
		t.Fatalf("GetSession after DeleteSession: %+v, %v", ended, err)
	}
	all, err := c.ListSessions(ctx, client.ListOptions{All: true, Metadata: map[string]string{"suite": "client"}})
	if err != nil || len(all) != 1 {
		t.Fatalf("ListSessions --all: %+v, %v", all, err)
	}
	if live, err := c.ListSessions(ctx, client.ListOptions{Metadata: map[string]string{"suite": "client"}}); err != nil || len(live) != 0 {
		t.Fatalf("ListSessions after the delete lists %+v, %v", live, err)
	}
}

func testExec(t *testing.T, c *client.Client) {
	s := newSession(t, c, client.CreateRequest{})
	ctx := ctxFor(t, 3*time.Minute)
	var stdout, stderr bytes.Buffer
	res, err := c.Exec(ctx, s.ID, client.ExecRequest{Cmd: "echo out; echo err >&2; printf %s \"$X\"; exit 7",
		Env: map[string]string{"X": "env"}}, &stdout, &stderr)
	if err != nil || res.ExitCode != 7 || stdout.String() != "out\nenv" || stderr.String() != "err\n" {
		t.Fatalf("Exec: %+v %v; stdout %q stderr %q", res, err, stdout.String(), stderr.String())
	}
	stdout.Reset()
	res, err = c.Exec(ctx, s.ID, client.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("piped")}, &stdout, nil)
	if err != nil || res.ExitCode != 0 || stdout.String() != "piped" {
		t.Fatalf("Exec with stdin: %+v %v; stdout %q", res, err, stdout.String())
	}
	out, err := c.ExecCollect(ctx, s.ID, client.ExecRequest{Cmd: "id -un; echo e >&2; exit 3", User: "root"})
	if err != nil || out.ExitCode != 3 || string(out.Stdout) != "root\n" || string(out.Stderr) != "e\n" {
		t.Fatalf("ExecCollect: %+v, %v", out, err)
	}
	res, err = c.Exec(ctx, s.ID, client.ExecRequest{Cmd: "sleep 30", TimeoutS: 1}, nil, nil)
	if err != nil || !res.TimedOut {
		t.Fatalf("Exec past its timeout: %+v, %v", res, err)
	}

	// A background command: listed, fed through stdin, attached to.
	pid, err := c.ExecBackground(ctx, s.ID, client.ExecRequest{Cmd: "read line; echo got $line; exit 5", KeepStdin: true})
	if err != nil || pid <= 0 {
		t.Fatalf("ExecBackground: %d, %v", pid, err)
	}
	procs, err := c.Processes(ctx, s.ID)
	if err != nil || !hasPid(procs, pid) {
		t.Fatalf("Processes: %+v, %v; want pid %d", procs, err, pid)
	}
	type attached struct {
		res *client.ExecResult
		out string
		err error
	}
	done := make(chan attached, 1)
	go func() {
		var b bytes.Buffer
		res, err := c.Attach(ctx, s.ID, pid, &b, nil)
		done <- attached{res, b.String(), err}
	}()
	time.Sleep(200 * time.Millisecond) // let the attach begin; the result arrives either way
	if err := c.SendStdin(ctx, s.ID, pid, []byte("hello\n"), true); err != nil {
		t.Fatalf("SendStdin: %v", err)
	}
	a := <-done
	if a.err != nil || a.res.ExitCode != 5 {
		t.Fatalf("Attach: %+v %q, %v", a.res, a.out, a.err)
	}

	// Signal and Kill end background commands.
	for name, stop := range map[string]func(pid int) error{
		"Signal": func(pid int) error { return c.Signal(ctx, s.ID, pid, 15) },
		"Kill":   func(pid int) error { return c.Kill(ctx, s.ID, pid) },
	} {
		pid, err := c.ExecBackground(ctx, s.ID, client.ExecRequest{Cmd: "sleep 300"})
		if err != nil {
			t.Fatalf("ExecBackground: %v", err)
		}
		if err := stop(pid); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		res, err := c.Attach(ctx, s.ID, pid, nil, nil)
		if err == nil && res.Signal == 0 {
			t.Errorf("%s: the command ended with %+v, want a signal", name, res)
		}
		if procs, err := c.Processes(ctx, s.ID); err != nil || hasPid(procs, pid) {
			t.Errorf("%s: still listed: %+v, %v", name, procs, err)
		}
	}
}

func hasPid(procs []client.Process, pid int) bool {
	for _, p := range procs {
		if p.Pid == pid {
			return true
		}
	}
	return false
}

func testFiles(t *testing.T, c *client.Client) {
	s := newSession(t, c, client.CreateRequest{})
	ctx := ctxFor(t, 2*time.Minute)
	data := strings.Repeat("forkbox ", 1<<14) // 128 KiB
	e, err := c.Upload(ctx, s.ID, "/home/user/in/a.txt", strings.NewReader(data), int64(len(data)), "")
	if err != nil || e.Size != int64(len(data)) || e.Type != "file" {
		t.Fatalf("Upload: %+v, %v", e, err)
	}
	if e, err := c.Stat(ctx, s.ID, "/home/user/in/a.txt", ""); err != nil || e.Size != int64(len(data)) || e.Owner != "user" {
		t.Fatalf("Stat: %+v, %v", e, err)
	}
	if e, err := c.MakeDir(ctx, s.ID, "/home/user/in/sub", ""); err != nil || e.Type != "dir" {
		t.Fatalf("MakeDir: %+v, %v", e, err)
	}
	if e, err := c.Move(ctx, s.ID, "/home/user/in/a.txt", "/home/user/in/sub/b.txt", ""); err != nil || e.Name != "b.txt" {
		t.Fatalf("Move: %+v, %v", e, err)
	}
	entries, err := c.ListDir(ctx, s.ID, "/home/user/in", 2, "")
	if err != nil || len(entries) != 2 {
		t.Fatalf("ListDir: %+v, %v; want sub and sub/b.txt", entries, err)
	}
	rc, err := c.Download(ctx, s.ID, "/home/user/in/sub/b.txt", "")
	if err != nil {
		t.Fatalf("Download: %v", err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || string(got) != data {
		t.Fatalf("Download: %d bytes (%v), want the %d uploaded", len(got), err, len(data))
	}
	// Local files: uploaded with their size, downloaded whole or not at all.
	dir := t.TempDir()
	local := filepath.Join(dir, "local.txt")
	if err := os.WriteFile(local, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	if e, err := c.UploadFile(ctx, s.ID, "/tmp/local.txt", local, ""); err != nil || e.Size != int64(len(data)) {
		t.Fatalf("UploadFile: %+v, %v", e, err)
	}
	if _, err := c.UploadFile(ctx, s.ID, "/tmp/dir", dir, ""); err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Fatalf("UploadFile of a directory: %v", err)
	}
	back := filepath.Join(dir, "back.txt")
	if err := c.DownloadFile(ctx, s.ID, "/tmp/local.txt", back, ""); err != nil {
		t.Fatalf("DownloadFile: %v", err)
	}
	if b, err := os.ReadFile(back); err != nil || string(b) != data {
		t.Fatalf("DownloadFile wrote %d bytes (%v), want %d", len(b), err, len(data))
	}
	err = c.DownloadFile(ctx, s.ID, "/tmp/missing", filepath.Join(dir, "missing"), "")
	wantClass(t, "DownloadFile of a missing file", err, errdefs.ErrNotFound)
	if names, _ := os.ReadDir(dir); len(names) != 2 {
		t.Fatalf("after the downloads the directory holds %v, want local.txt and back.txt", names)
	}
	if err := c.Remove(ctx, s.ID, "/home/user/in", ""); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	_, err = c.Stat(ctx, s.ID, "/home/user/in", "")
	wantClass(t, "Stat of a removed directory", err, errdefs.ErrNotFound)
	_, err = c.Download(ctx, s.ID, "/home/user/in/sub/b.txt", "")
	wantClass(t, "Download of a removed file", err, errdefs.ErrNotFound)
}
