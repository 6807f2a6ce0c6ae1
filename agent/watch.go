package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/internal/envdpb/filesystempb"
)

// watchMask is the set of inotify events the agent asks for on every
// watched directory.
const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_CLOSE_WRITE | unix.IN_DELETE |
	unix.IN_MOVED_FROM | unix.IN_MOVED_TO | unix.IN_ATTRIB | unix.IN_DELETE_SELF |
	unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// maxBufferedEvents bounds a polled watcher's queue; beyond it the oldest
// events are dropped.
const maxBufferedEvents = 10000

// inotifyEventSize is sizeof(struct inotify_event) without its name:
// wd int32, mask, cookie and len uint32, in host byte order.
const inotifyEventSize = 16

// dirWatcher watches one directory (and, if recursive, every directory
// below it, including ones created later) with an inotify instance and
// turns kernel events into protocol events named relative to the root.
//
// Mapping: IN_CREATE and IN_MOVED_TO -> CREATE (a file moved in appears,
// like fsnotify and envd report it), IN_MODIFY -> WRITE, IN_CLOSE_WRITE ->
// WRITE only when no IN_MODIFY came since the file's last close (so mmap
// writes are seen and a plain write is not reported twice; consecutive
// WRITEs of one file read in one batch are also merged),
// IN_DELETE -> REMOVE, IN_MOVED_FROM -> RENAME (the old name), IN_ATTRIB
// -> CHMOD. When a recursive watch sees a new directory it watches it and
// reports CREATE for what is already inside, so a fast `mkdir -p a/b`
// still yields a/b (an entry may then be reported twice). The watch ends
// when the root is deleted or moved.
type dirWatcher struct {
	root         string
	recursive    bool
	includeEntry bool
	file         *os.File // non-blocking inotify fd, read through Go's poller

	mu   sync.Mutex
	dirs map[int32]string // watch descriptor -> directory relative to root ("" = root)

	// modified holds files with an IN_MODIFY since their last
	// IN_CLOSE_WRITE; only run's goroutine uses it.
	modified map[string]bool
	// uploadCookie is the rename cookie of the last upload temporary file
	// moved away (uploadTempPrefix); only run's goroutine uses it.
	uploadCookie uint32

	stop     chan struct{} // closed by close
	done     chan struct{} // closed when run returns
	stopOnce sync.Once
}

// newDirWatcher starts watching root (a symlink to a directory is
// followed). Errors are Connect errors: not_found for a missing root,
// invalid_argument for a non-directory, resource_exhausted when the
// inotify instance or watch limits are reached.
func newDirWatcher(root string, recursive, includeEntry bool) (*dirWatcher, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return nil, lookupError(err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", root))
	}
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("inotify_init: %w", err))
	}
	w := &dirWatcher{
		root: root, recursive: recursive, includeEntry: includeEntry,
		file: os.NewFile(uintptr(fd), "inotify"),
		dirs: map[int32]string{}, modified: map[string]bool{}, stop: make(chan struct{}), done: make(chan struct{}),
	}
	err = w.addWatch("", true)
	if err == nil && recursive {
		err = w.addTree("", nil)
	}
	if err != nil {
		w.file.Close()
		if errors.Is(err, unix.ENOSPC) { // from inotify_add_watch: the watch limit, not a full disk
			return nil, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("inotify watch limit reached: %w", err))
		}
		return nil, fsError(err)
	}
	return w, nil
}

// addWatch watches the directory rel (relative to the root); follow says
// whether a symlink there is followed. Its error is the syscall's.
func (w *dirWatcher) addWatch(rel string, follow bool) error {
	mask := uint32(watchMask)
	if !follow {
		mask |= unix.IN_DONT_FOLLOW
	}
	p := filepath.Join(w.root, rel)
	var wd int
	var werr error
	rc, err := w.file.SyscallConn()
	if err != nil {
		return err
	}
	if err := rc.Control(func(fd uintptr) { wd, werr = unix.InotifyAddWatch(int(fd), p, mask) }); err != nil {
		return err
	}
	if werr != nil {
		return &os.PathError{Op: "inotify_add_watch", Path: p, Err: werr}
	}
	w.mu.Lock()
	w.dirs[int32(wd)] = rel
	w.mu.Unlock()
	return nil
}

// addTree watches every directory below rel (not following symlinks) and
// calls found, if not nil, with each entry's relative path, parents first.
// Entries that vanish or cannot be read are skipped; only hitting the
// watch limit (ENOSPC) is an error.
func (w *dirWatcher) addTree(rel string, found func(rel string)) error {
	ents, err := os.ReadDir(filepath.Join(w.root, rel))
	if err != nil {
		return nil
	}
	for _, de := range ents {
		child := filepath.Join(rel, de.Name())
		if found != nil {
			found(child)
		}
		if !de.IsDir() {
			continue
		}
		if err := w.addWatch(child, false); err != nil {
			if errors.Is(err, unix.ENOSPC) {
				return err
			}
			continue
		}
		if err := w.addTree(child, found); err != nil {
			return err
		}
	}
	return nil
}

// dropTree stops watching rel and every watched directory below it, as
// when it was moved away (it is watched afresh if it reappears inside).
func (w *dirWatcher) dropTree(rel string) {
	rc, err := w.file.SyscallConn()
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for wd, d := range w.dirs {
		if d == rel || strings.HasPrefix(d, rel+"/") {
			_ = rc.Control(func(fd uintptr) { _, _ = unix.InotifyRmWatch(int(fd), uint32(wd)) })
			delete(w.dirs, wd)
		}
	}
}

// close stops the watcher and waits for run to return; it is idempotent.
// run must have been started.
func (w *dirWatcher) close() {
	w.stopOnce.Do(func() {
		close(w.stop)
		w.file.Close()
	})
	<-w.done
}

// run reads kernel events until the watcher is closed, the root goes away
// or emit returns false, passing each protocol event to emit in order.
func (w *dirWatcher) run(emit func(*filesystempb.FilesystemEvent) bool) {
	defer close(w.done)
	buf := make([]byte, 64*1024)
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			return
		}
		if !w.handle(buf[:n], emit) {
			return
		}
	}
}

// handle decodes one read's worth of inotify events from buf and emits
// them; it returns false when the watch is over.
func (w *dirWatcher) handle(buf []byte, emit func(*filesystempb.FilesystemEvent) bool) bool {
	var lastName string
	var lastType filesystempb.EventType
	send := func(rel string, typ filesystempb.EventType) bool {
		if typ == filesystempb.EventType_EVENT_TYPE_WRITE && typ == lastType && rel == lastName {
			return true
		}
		lastName, lastType = rel, typ
		ev := &filesystempb.FilesystemEvent{Name: validUTF8(rel), Type: typ}
		if w.includeEntry {
			if e, err := entryInfo(filepath.Join(w.root, rel)); err == nil {
				ev.Entry = e
			}
		}
		return emit(ev)
	}
	for len(buf) >= inotifyEventSize {
		wd := int32(binary.NativeEndian.Uint32(buf[0:]))
		mask := binary.NativeEndian.Uint32(buf[4:])
		nameLen := int(binary.NativeEndian.Uint32(buf[12:]))
		if inotifyEventSize+nameLen > len(buf) {
			return true
		}
		cookie := binary.NativeEndian.Uint32(buf[8:])
		name := string(bytes.TrimRight(buf[inotifyEventSize:inotifyEventSize+nameLen], "\x00"))
		buf = buf[inotifyEventSize+nameLen:]
		// An upload's temporary file is the agent's own business: its
		// events are dropped, and its rename onto the destination reads as
		// the destination being created and written, as a direct write
		// would (E2B's envd writes in place).
		if strings.HasPrefix(name, uploadTempPrefix) {
			if mask&unix.IN_MOVED_FROM != 0 {
				w.uploadCookie = cookie
			}
			continue
		}
		fromUpload := mask&unix.IN_MOVED_TO != 0 && cookie != 0 && cookie == w.uploadCookie

		w.mu.Lock()
		dir, known := w.dirs[wd]
		if mask&unix.IN_IGNORED != 0 {
			delete(w.dirs, wd)
		}
		w.mu.Unlock()
		if !known {
			continue // overflow (wd -1) or a watch already dropped
		}
		if name == "" {
			if dir == "" && mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_IGNORED|unix.IN_UNMOUNT) != 0 {
				return false
			}
			continue // the parent directory's watch reports changes to subdirectories
		}
		rel := filepath.Join(dir, name)
		isDir := mask&unix.IN_ISDIR != 0
		var typ filesystempb.EventType
		switch {
		case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
			typ = filesystempb.EventType_EVENT_TYPE_CREATE
		case mask&unix.IN_MOVED_FROM != 0:
			typ = filesystempb.EventType_EVENT_TYPE_RENAME
			delete(w.modified, rel)
			if w.recursive && isDir {
				w.dropTree(rel) // watched afresh if it reappears inside
			}
		case mask&unix.IN_DELETE != 0:
			typ = filesystempb.EventType_EVENT_TYPE_REMOVE
			delete(w.modified, rel)
		case mask&unix.IN_MODIFY != 0:
			typ = filesystempb.EventType_EVENT_TYPE_WRITE
			w.modified[rel] = true
		case mask&unix.IN_CLOSE_WRITE != 0:
			if w.modified[rel] {
				delete(w.modified, rel) // already reported by IN_MODIFY
				continue
			}
			typ = filesystempb.EventType_EVENT_TYPE_WRITE
		case mask&unix.IN_ATTRIB != 0:
			typ = filesystempb.EventType_EVENT_TYPE_CHMOD
		default:
			continue
		}
		// A new directory is watched before it is reported, so a client that
		// reacts to its CREATE misses nothing inside it.
		newDir := typ == filesystempb.EventType_EVENT_TYPE_CREATE && w.recursive && isDir && w.addWatch(rel, false) == nil
		if !send(rel, typ) {
			return false
		}
		if fromUpload && !send(rel, filesystempb.EventType_EVENT_TYPE_WRITE) {
			return false
		}
		if newDir {
			ok := true
			_ = w.addTree(rel, func(sub string) {
				if !strings.HasPrefix(filepath.Base(sub), uploadTempPrefix) {
					ok = ok && send(sub, filesystempb.EventType_EVENT_TYPE_CREATE)
				}
			})
			if !ok {
				return false
			}
		}
	}
	return true
}

// WatchDir streams changes under path: first start (once the watch is in
// place), then filesystem events, with keepalives every
// Keepalive-Ping-Interval seconds. The stream ends cleanly when the watched
// directory is deleted or moved.
func (s *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystempb.WatchDirRequest], stream *connect.ServerStream[filesystempb.WatchDirResponse]) error {
	_, root, err := s.callerPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return err
	}
	w, err := newDirWatcher(root, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return err
	}
	events := make(chan *filesystempb.FilesystemEvent, 256) // closed when the watch ends
	go func() {
		w.run(func(ev *filesystempb.FilesystemEvent) bool {
			select {
			case events <- ev:
				return true
			case <-w.stop:
				return false
			}
		})
		close(events)
	}()
	defer w.close()
	start := &filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Start{Start: &filesystempb.WatchDirResponse_StartEvent{}}}
	if err := stream.Send(start); err != nil {
		return err
	}
	ka := time.NewTicker(keepaliveInterval(req.Header()))
	defer ka.Stop()
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return nil
			}
			if err := stream.Send(&filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Filesystem{Filesystem: ev}}); err != nil {
				return err
			}
		case <-ka.C:
			if err := stream.Send(&filesystempb.WatchDirResponse{Event: &filesystempb.WatchDirResponse_Keepalive{Keepalive: &filesystempb.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return connect.NewError(connect.CodeDeadlineExceeded, ctx.Err())
			}
			return connect.NewError(connect.CodeCanceled, ctx.Err())
		}
	}
}

// polledWatcher is a watcher whose events wait in a bounded queue for
// GetWatcherEvents.
type polledWatcher struct {
	w      *dirWatcher
	mu     sync.Mutex
	events []*filesystempb.FilesystemEvent
}

// CreateWatcher starts a polled watch on path and returns its random id.
// Events queue up (at most maxBufferedEvents, oldest dropped first) until
// GetWatcherEvents takes them; the watch lasts until RemoveWatcher.
func (s *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystempb.CreateWatcherRequest]) (*connect.Response[filesystempb.CreateWatcherResponse], error) {
	_, root, err := s.callerPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	w, err := newDirWatcher(root, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return nil, err
	}
	pw := &polledWatcher{w: w}
	go w.run(func(ev *filesystempb.FilesystemEvent) bool {
		pw.mu.Lock()
		defer pw.mu.Unlock()
		if len(pw.events) >= maxBufferedEvents {
			pw.events = pw.events[1:]
		}
		pw.events = append(pw.events, ev)
		return true
	})
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	id := hex.EncodeToString(raw[:])
	s.watchers.mu.Lock()
	s.watchers.m[id] = pw
	s.watchers.mu.Unlock()
	return connect.NewResponse(&filesystempb.CreateWatcherResponse{WatcherId: id}), nil
}

// GetWatcherEvents returns and clears the watcher's queued events, oldest
// first. Once the watch has ended (its directory was deleted or moved) and
// the last events have been returned, the watcher is gone: not_found.
func (s *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystempb.GetWatcherEventsRequest]) (*connect.Response[filesystempb.GetWatcherEventsResponse], error) {
	id := req.Msg.GetWatcherId()
	pw, err := s.watchers.get(id)
	if err != nil {
		return nil, err
	}
	ended := false
	select {
	case <-pw.w.done:
		ended = true
	default:
	}
	pw.mu.Lock()
	evs := pw.events
	pw.events = nil
	pw.mu.Unlock()
	if ended && len(evs) == 0 {
		if old := s.watchers.remove(id); old != nil {
			old.w.close()
		}
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q ended: its directory is gone", id))
	}
	return connect.NewResponse(&filesystempb.GetWatcherEventsResponse{Events: evs}), nil
}

// RemoveWatcher stops and forgets a polled watcher; unknown ids are not_found.
func (s *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystempb.RemoveWatcherRequest]) (*connect.Response[filesystempb.RemoveWatcherResponse], error) {
	pw := s.watchers.remove(req.Msg.GetWatcherId())
	if pw == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", req.Msg.GetWatcherId()))
	}
	pw.w.close()
	return connect.NewResponse(&filesystempb.RemoveWatcherResponse{}), nil
}
