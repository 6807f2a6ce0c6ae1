package agent

import (
	"context"
	"encoding/base64"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/internal/envdpb/filesystempb"
	"github.com/forkbox/forkbox/internal/envdpb/filesystempb/filesystempbconnect"
)

// requireRoot skips t unless the test runs as root (chown and ownership checks).
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: the agent chowns files and runs as root in the sandbox")
	}
}

// newTestAgent serves an agent whose default user is root and returns the
// server and a filesystem client for it; both close with t.
func newTestAgent(t *testing.T) (*httptest.Server, filesystempbconnect.FilesystemClient) {
	t.Helper()
	a := New(wire.Config{DefaultUser: "root"}, slog.Default())
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	return srv, filesystempbconnect.NewFilesystemClient(http.DefaultClient, srv.URL)
}

// asUser returns a connect request for msg carrying name as the Basic-auth user.
func asUser[T any](msg *T, name string) *connect.Request[T] {
	req := connect.NewRequest(msg)
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(name+":")))
	return req
}

// wantCode fails t unless err is a Connect error with code.
func wantCode(t *testing.T, err error, code connect.Code) {
	t.Helper()
	if err == nil || connect.CodeOf(err) != code {
		t.Fatalf("want %v error, got %v", code, err)
	}
}

// TestStatAndListDir checks entry fields (type, size, mode, owner, symlink
// target, metadata), ListDir depths without following symlinks, and not_found
// and invalid_argument codes.
func TestStatAndListDir(t *testing.T) {
	requireRoot(t)
	_, c := newTestAgent(t)
	ctx := context.Background()
	root := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(root, "a.txt"), []byte("hello"), 0o644))
	must(os.MkdirAll(filepath.Join(root, "sub", "deep"), 0o755))
	must(os.WriteFile(filepath.Join(root, "sub", "b.txt"), nil, 0o600))
	must(os.WriteFile(filepath.Join(root, "sub", "deep", "c.txt"), nil, 0o600))
	must(os.Symlink("a.txt", filepath.Join(root, "link")))
	must(os.Symlink("sub", filepath.Join(root, "dirlink")))
	xattrs := userXattrs(root)
	if xattrs {
		must(unix.Setxattr(filepath.Join(root, "a.txt"), "user.e2b.owner-note", []byte("hi"), 0))
		must(unix.Setxattr(filepath.Join(root, "a.txt"), "user.other", []byte("no"), 0))
	} else {
		t.Log("temp filesystem has no user xattrs; metadata not checked")
	}

	st, err := c.Stat(ctx, connect.NewRequest(&filesystempb.StatRequest{Path: filepath.Join(root, "a.txt")}))
	must(err)
	e := st.Msg.GetEntry()
	if e.GetName() != "a.txt" || e.GetType() != filesystempb.FileType_FILE_TYPE_FILE || e.GetSize() != 5 ||
		e.GetMode() != 0o644 || e.GetPermissions() != "-rw-r--r--" || e.GetOwner() != "root" ||
		e.GetGroup() != "root" || e.GetPath() != filepath.Join(root, "a.txt") || e.GetModifiedTime() == nil {
		t.Fatalf("bad entry %v", e)
	}
	if md := e.GetMetadata(); xattrs && (len(md) != 1 || md["owner-note"] != "hi") {
		t.Fatalf("metadata = %v", md)
	}
	st, err = c.Stat(ctx, connect.NewRequest(&filesystempb.StatRequest{Path: filepath.Join(root, "link")}))
	must(err)
	if e := st.Msg.GetEntry(); e.GetType() != filesystempb.FileType_FILE_TYPE_SYMLINK || e.GetSymlinkTarget() != "a.txt" {
		t.Fatalf("bad symlink entry %v", e)
	}
	st, err = c.Stat(ctx, connect.NewRequest(&filesystempb.StatRequest{Path: root}))
	must(err)
	if e := st.Msg.GetEntry(); e.GetType() != filesystempb.FileType_FILE_TYPE_DIRECTORY || e.GetPermissions()[0] != 'd' {
		t.Fatalf("bad dir entry %v", e)
	}
	_, err = c.Stat(ctx, connect.NewRequest(&filesystempb.StatRequest{Path: filepath.Join(root, "missing")}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = c.Stat(ctx, connect.NewRequest(&filesystempb.StatRequest{Path: filepath.Join(root, "a.txt", "x")}))
	wantCode(t, err, connect.CodeNotFound)

	list := func(depth uint32) []string {
		t.Helper()
		res, err := c.ListDir(ctx, connect.NewRequest(&filesystempb.ListDirRequest{Path: root, Depth: depth}))
		must(err)
		var rels []string
		for _, e := range res.Msg.GetEntries() {
			rel, _ := filepath.Rel(root, e.GetPath())
			if filepath.Base(e.GetPath()) != e.GetName() {
				t.Fatalf("name %q does not match path %q", e.GetName(), e.GetPath())
			}
			if rel == "dirlink" && e.GetType() != filesystempb.FileType_FILE_TYPE_SYMLINK {
				t.Fatalf("dirlink listed as %v", e.GetType())
			}
			rels = append(rels, rel)
		}
		sort.Strings(rels)
		return rels
	}
	if got, want := list(0), []string{"a.txt", "dirlink", "link", "sub"}; !slices.Equal(got, want) {
		t.Fatalf("depth 0: got %v want %v", got, want)
	}
	if got, want := list(2), []string{"a.txt", "dirlink", "link", "sub", "sub/b.txt", "sub/deep"}; !slices.Equal(got, want) {
		t.Fatalf("depth 2: got %v want %v", got, want)
	}
	if got := list(5); len(got) != 7 {
		t.Fatalf("depth 5: got %v", got)
	}
	_, err = c.ListDir(ctx, connect.NewRequest(&filesystempb.ListDirRequest{Path: filepath.Join(root, "nope")}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = c.ListDir(ctx, connect.NewRequest(&filesystempb.ListDirRequest{Path: filepath.Join(root, "a.txt")}))
	wantCode(t, err, connect.CodeInvalidArgument)
}

// TestMakeDirMoveRemove checks MakeDir (parents owned by the caller,
// already_exists, a file in the way), Move into new directories, Remove of
// files and trees, not_found codes and an unknown user.
func TestMakeDirMoveRemove(t *testing.T) {
	requireRoot(t)
	_, c := newTestAgent(t)
	ctx := context.Background()
	root := t.TempDir()

	dir := filepath.Join(root, "x", "y", "z")
	res, err := c.MakeDir(ctx, asUser(&filesystempb.MakeDirRequest{Path: dir}, "1000"))
	if err != nil {
		t.Fatal(err)
	}
	if e := res.Msg.GetEntry(); e.GetType() != filesystempb.FileType_FILE_TYPE_DIRECTORY || e.GetPath() != dir {
		t.Fatalf("bad entry %v", e)
	}
	for _, d := range []string{"x", "x/y", "x/y/z"} {
		if uid, gid := ownerOf(t, filepath.Join(root, d)); uid != 1000 || gid != 1000 {
			t.Fatalf("%s owned by %d:%d, want 1000:1000", d, uid, gid)
		}
	}
	if uid, _ := ownerOf(t, root); uid != 0 {
		t.Fatalf("existing parent re-owned to %d", uid)
	}
	_, err = c.MakeDir(ctx, connect.NewRequest(&filesystempb.MakeDirRequest{Path: dir}))
	wantCode(t, err, connect.CodeAlreadyExists)
	f := filepath.Join(root, "file")
	if err := os.WriteFile(f, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = c.MakeDir(ctx, connect.NewRequest(&filesystempb.MakeDirRequest{Path: f}))
	wantCode(t, err, connect.CodeInvalidArgument)
	_, err = c.MakeDir(ctx, connect.NewRequest(&filesystempb.MakeDirRequest{Path: filepath.Join(f, "sub")}))
	wantCode(t, err, connect.CodeInvalidArgument)

	dst := filepath.Join(root, "new", "parent", "moved ü.txt")
	mv, err := c.Move(ctx, connect.NewRequest(&filesystempb.MoveRequest{Source: f, Destination: dst}))
	if err != nil {
		t.Fatal(err)
	}
	if e := mv.Msg.GetEntry(); e.GetPath() != dst || e.GetName() != "moved ü.txt" || e.GetSize() != 4 {
		t.Fatalf("bad moved entry %v", e)
	}
	if _, err := os.Stat(f); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("source still there: %v", err)
	}
	_, err = c.Move(ctx, connect.NewRequest(&filesystempb.MoveRequest{Source: f, Destination: dst + "2"}))
	wantCode(t, err, connect.CodeNotFound)

	_, err = c.Remove(ctx, connect.NewRequest(&filesystempb.RemoveRequest{Path: dst}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Remove(ctx, connect.NewRequest(&filesystempb.RemoveRequest{Path: filepath.Join(root, "x")}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "x")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("tree still there: %v", err)
	}
	_, err = c.Remove(ctx, connect.NewRequest(&filesystempb.RemoveRequest{Path: dst}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = c.Stat(ctx, asUser(&filesystempb.StatRequest{Path: root}, "no-such-user-xyz"))
	wantCode(t, err, connect.CodeUnauthenticated)
}

// watchEvent is a received event reduced to what the tests compare.
type watchEvent struct {
	name string
	typ  filesystempb.EventType
}

// waitFor reads from ch until want has been seen (in order, other events
// in between allowed) or 5 s pass.
func waitFor(t *testing.T, ch <-chan watchEvent, want ...watchEvent) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	var got []watchEvent
	for len(want) > 0 {
		select {
		case ev := <-ch:
			got = append(got, ev)
			if ev == want[0] {
				want = want[1:]
			}
		case <-deadline:
			t.Fatalf("missing %v; got %v", want, got)
		}
	}
}

// TestWatchDir checks the stream: start first, create/write/chmod/rename/
// remove events, new subdirectories watched, keepalives, errors, and a clean
// end when the directory is removed.
func TestWatchDir(t *testing.T) {
	requireRoot(t)
	_, c := newTestAgent(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root := t.TempDir()

	req := connect.NewRequest(&filesystempb.WatchDirRequest{Path: root, Recursive: true, IncludeEntry: true})
	req.Header().Set("Keepalive-Ping-Interval", "1")
	stream, err := c.WatchDir(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("first message is not start: %v %v", stream.Msg(), stream.Err())
	}
	events := make(chan watchEvent, 100)
	keepalive := make(chan struct{}, 10)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		for stream.Receive() {
			if stream.Msg().GetKeepalive() != nil {
				keepalive <- struct{}{}
			}
			if fe := stream.Msg().GetFilesystem(); fe != nil {
				if fe.GetType() == filesystempb.EventType_EVENT_TYPE_CREATE && fe.GetEntry() == nil && fe.GetName() == "a.txt" {
					t.Errorf("create event without entry")
				}
				if strings.Contains(fe.GetName(), uploadTempPrefix) {
					t.Errorf("event of an upload's temporary file: %v", fe)
				}
				events <- watchEvent{fe.GetName(), fe.GetType()}
			}
		}
	}()
	a := filepath.Join(root, "a.txt")
	if err := os.WriteFile(a, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, events, watchEvent{"a.txt", filesystempb.EventType_EVENT_TYPE_CREATE})
	if err := os.WriteFile(a, []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, events, watchEvent{"a.txt", filesystempb.EventType_EVENT_TYPE_WRITE})
	if err := os.Chmod(a, 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, events, watchEvent{"a.txt", filesystempb.EventType_EVENT_TYPE_CHMOD})
	if err := os.Rename(a, filepath.Join(root, "b.txt")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, events, watchEvent{"a.txt", filesystempb.EventType_EVENT_TYPE_RENAME},
		watchEvent{"b.txt", filesystempb.EventType_EVENT_TYPE_CREATE})
	if err := os.Remove(filepath.Join(root, "b.txt")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, events, watchEvent{"b.txt", filesystempb.EventType_EVENT_TYPE_REMOVE})

	// A directory created after the watch started is watched too.
	if err := os.Mkdir(filepath.Join(root, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	waitFor(t, events, watchEvent{"sub", filesystempb.EventType_EVENT_TYPE_CREATE})
	if err := os.WriteFile(filepath.Join(root, "sub", "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, events, watchEvent{"sub/f", filesystempb.EventType_EVENT_TYPE_CREATE},
		watchEvent{"sub/f", filesystempb.EventType_EVENT_TYPE_WRITE})
	// mkdir -p: inner directories are reported even if created before their watch.
	if err := os.MkdirAll(filepath.Join(root, "p", "q", "r"), 0o755); err != nil {
		t.Fatal(err)
	}
	waitFor(t, events, watchEvent{"p/q/r", filesystempb.EventType_EVENT_TYPE_CREATE})
	// An upload (temporary file renamed over the destination) reads as the
	// destination's create and write; the temporary name never shows.
	tmp := filepath.Join(root, "sub", uploadTempPrefix+"1234")
	if err := os.WriteFile(tmp, []byte("uploaded"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(root, "sub", "up.txt")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, events, watchEvent{"sub/up.txt", filesystempb.EventType_EVENT_TYPE_CREATE},
		watchEvent{"sub/up.txt", filesystempb.EventType_EVENT_TYPE_WRITE})
	// Also when the upload lands in a directory created just before it
	// (found by the scan of the new directory, not by an event).
	fresh := filepath.Join(root, "fresh")
	if err := os.Mkdir(fresh, 0o755); err != nil {
		t.Fatal(err)
	}
	tmp = filepath.Join(fresh, uploadTempPrefix+"5678")
	if err := os.WriteFile(tmp, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(fresh, "up2.txt")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, events, watchEvent{"fresh/up2.txt", filesystempb.EventType_EVENT_TYPE_CREATE})
	select {
	case <-keepalive:
	case <-time.After(3 * time.Second):
		t.Fatal("no keepalive with Keepalive-Ping-Interval: 1")
	}

	// Errors arrive on the stream.
	for path, code := range map[string]connect.Code{filepath.Join(root, "none"): connect.CodeNotFound, "/etc/passwd": connect.CodeInvalidArgument} {
		s, err := c.WatchDir(ctx, connect.NewRequest(&filesystempb.WatchDirRequest{Path: path}))
		if err == nil {
			for s.Receive() {
			}
			err = s.Err()
		}
		wantCode(t, err, code)
	}
	// The stream ends cleanly when the watched directory goes away.
	if err := os.RemoveAll(root); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ended:
		if err := stream.Err(); err != nil {
			t.Fatalf("stream ended with %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("stream still open after its directory was removed")
	}
}

// TestWatcherPolling checks CreateWatcher, GetWatcherEvents and
// RemoveWatcher, including not_found for unknown and ended watchers.
func TestWatcherPolling(t *testing.T) {
	requireRoot(t)
	_, c := newTestAgent(t)
	ctx := context.Background()
	root := t.TempDir()
	cw, err := c.CreateWatcher(ctx, connect.NewRequest(&filesystempb.CreateWatcherRequest{Path: root}))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.GetWatcherId()
	if len(id) < 16 {
		t.Fatalf("short watcher id %q", id)
	}
	if err := os.WriteFile(filepath.Join(root, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(root, "f")); err != nil {
		t.Fatal(err)
	}
	var got []watchEvent
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		res, err := c.GetWatcherEvents(ctx, connect.NewRequest(&filesystempb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range res.Msg.GetEvents() {
			got = append(got, watchEvent{e.GetName(), e.GetType()})
		}
		if len(got) > 0 && got[len(got)-1].typ == filesystempb.EventType_EVENT_TYPE_REMOVE {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	want := []watchEvent{{"f", filesystempb.EventType_EVENT_TYPE_CREATE}, {"f", filesystempb.EventType_EVENT_TYPE_WRITE}, {"f", filesystempb.EventType_EVENT_TYPE_REMOVE}}
	if !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if _, err := c.RemoveWatcher(ctx, connect.NewRequest(&filesystempb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	_, err = c.GetWatcherEvents(ctx, connect.NewRequest(&filesystempb.GetWatcherEventsRequest{WatcherId: id}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = c.RemoveWatcher(ctx, connect.NewRequest(&filesystempb.RemoveWatcherRequest{WatcherId: id}))
	wantCode(t, err, connect.CodeNotFound)
	_, err = c.CreateWatcher(ctx, connect.NewRequest(&filesystempb.CreateWatcherRequest{Path: filepath.Join(root, "none")}))
	wantCode(t, err, connect.CodeNotFound)

	// A watcher whose directory is removed yields its last events, then not_found.
	sub := filepath.Join(root, "sub")
	os.Mkdir(sub, 0o755)
	cw, err = c.CreateWatcher(ctx, connect.NewRequest(&filesystempb.CreateWatcherRequest{Path: sub}))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(sub, "g"), nil, 0o644)
	os.RemoveAll(sub)
	var last []watchEvent
	for time.Now().Before(deadline.Add(5 * time.Second)) {
		res, err := c.GetWatcherEvents(ctx, connect.NewRequest(&filesystempb.GetWatcherEventsRequest{WatcherId: cw.Msg.GetWatcherId()}))
		if connect.CodeOf(err) == connect.CodeNotFound {
			if len(last) == 0 || last[len(last)-1] != (watchEvent{"g", filesystempb.EventType_EVENT_TYPE_REMOVE}) {
				t.Fatalf("events before the end: %v", last)
			}
			return
		} else if err != nil {
			t.Fatal(err)
		}
		for _, e := range res.Msg.GetEvents() {
			last = append(last, watchEvent{e.GetName(), e.GetType()})
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("watcher of a removed directory never ended")
}
