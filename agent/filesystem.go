package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/forkbox/forkbox/internal/envdpb/filesystempb"
	"github.com/forkbox/forkbox/internal/envdpb/filesystempb/filesystempbconnect"
)

// xattrPrefix is the extended-attribute namespace that holds E2B file
// metadata; EntryInfo.metadata shows these attributes without the prefix.
const xattrPrefix = "user.e2b."

// filesystemService implements envd's filesystem.Filesystem service. Every
// call acts as root inside the sandbox on behalf of the user named in the
// Basic authorization header (else the default user): relative paths start
// at that user's home and directories it creates belong to that user.
type filesystemService struct {
	a        *Agent
	watchers *watcherTable
}

// The service implements every filesystem RPC.
var _ filesystempbconnect.FilesystemHandler = (*filesystemService)(nil)

// newFilesystemService returns the filesystem service for a, with no watchers.
func newFilesystemService(a *Agent) *filesystemService {
	return &filesystemService{a: a, watchers: newWatcherTable()}
}

// caller resolves the calling user from the request headers h; an unknown
// user is an unauthenticated error.
func (s *filesystemService) caller(h http.Header) (*account, error) {
	return s.a.accounts.lookup(userFromRequest(h, s.a.config().DefaultUser))
}

// callerPath resolves the calling user and p (made absolute against the
// user's home). An empty p is an invalid_argument error.
func (s *filesystemService) callerPath(h http.Header, p string) (*account, string, error) {
	acc, err := s.caller(h)
	if err != nil {
		return nil, "", err
	}
	if p == "" {
		return nil, "", connect.NewError(connect.CodeInvalidArgument, errors.New("path is empty"))
	}
	return acc, resolvePath(p, acc.Home), nil
}

// Stat describes the file, directory or symlink (not followed) at path.
func (s *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystempb.StatRequest]) (*connect.Response[filesystempb.StatResponse], error) {
	_, p, err := s.callerPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	e, err := entryInfo(p)
	if err != nil {
		return nil, lookupError(err)
	}
	return connect.NewResponse(&filesystempb.StatResponse{Entry: e}), nil
}

// ListDir lists the directory at path (a symlink to a directory is
// followed) down to depth levels; depth 0 means 1. Entries are in walk
// order (a directory before its contents, names sorted); symlinks inside
// the tree are reported, never followed.
func (s *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystempb.ListDirRequest]) (*connect.Response[filesystempb.ListDirResponse], error) {
	_, root, err := s.callerPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	fi, err := os.Stat(root)
	if err != nil {
		return nil, lookupError(err)
	}
	if !fi.IsDir() {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s is not a directory", root))
	}
	depth := int(req.Msg.GetDepth())
	if depth == 0 {
		depth = 1
	}
	out := &filesystempb.ListDirResponse{}
	if err := listTree(ctx, root, depth, &out.Entries); err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

// listTree appends the entries of dir to out and descends into real
// subdirectories while depth > 1. Entries that vanish during the walk are
// skipped; unreadable subdirectories are listed but not descended into.
func listTree(ctx context.Context, dir string, depth int, out *[]*filesystempb.EntryInfo) error {
	if err := ctx.Err(); err != nil {
		return connect.NewError(connect.CodeCanceled, err)
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fsError(err)
	}
	for _, de := range ents {
		p := filepath.Join(dir, de.Name())
		e, err := entryInfo(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		} else if err != nil {
			return fsError(err)
		}
		*out = append(*out, e)
		if depth > 1 && de.IsDir() {
			if err := listTree(ctx, p, depth-1, out); err != nil && connect.CodeOf(err) != connect.CodePermissionDenied {
				return err
			}
		}
	}
	return nil
}

// MakeDir creates path and any missing parents (mode 0755, owned by the
// caller). It is already_exists if path is a directory and
// invalid_argument if it is something else.
func (s *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystempb.MakeDirRequest]) (*connect.Response[filesystempb.MakeDirResponse], error) {
	acc, p, err := s.callerPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if fi, err := os.Stat(p); err == nil {
		if fi.IsDir() {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", p))
		}
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%s already exists and is not a directory", p))
	}
	if err := mkdirAllOwned(p, acc); err != nil {
		return nil, fsError(err)
	}
	e, err := entryInfo(p)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystempb.MakeDirResponse{Entry: e}), nil
}

// Move renames source to destination, creating the destination's missing
// parent directories (owned by the caller), and describes the result.
// Moving across filesystems is failed_precondition.
func (s *filesystemService) Move(ctx context.Context, req *connect.Request[filesystempb.MoveRequest]) (*connect.Response[filesystempb.MoveResponse], error) {
	acc, src, err := s.callerPath(req.Header(), req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	if req.Msg.GetDestination() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("destination is empty"))
	}
	dst := resolvePath(req.Msg.GetDestination(), acc.Home)
	if _, err := os.Lstat(src); err != nil {
		return nil, lookupError(err)
	}
	if err := mkdirAllOwned(filepath.Dir(dst), acc); err != nil {
		return nil, fsError(err)
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, fsError(err)
	}
	e, err := entryInfo(dst)
	if err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystempb.MoveResponse{Entry: e}), nil
}

// Remove deletes the file, symlink or whole directory tree at path.
func (s *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystempb.RemoveRequest]) (*connect.Response[filesystempb.RemoveResponse], error) {
	_, p, err := s.callerPath(req.Header(), req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(p); err != nil {
		return nil, lookupError(err)
	}
	if err := os.RemoveAll(p); err != nil {
		return nil, fsError(err)
	}
	return connect.NewResponse(&filesystempb.RemoveResponse{}), nil
}

// mkdirAllOwned creates dir and its missing parents with mode 0755 and
// chowns each directory it creates to acc. An existing directory is fine;
// an existing non-directory on the way is a *PathError wrapping ENOTDIR.
func mkdirAllOwned(dir string, acc *account) error {
	dir = filepath.Clean(dir)
	fi, err := os.Stat(dir)
	if err == nil {
		if !fi.IsDir() {
			return &fs.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
		}
		return nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirAllOwned(parent, acc); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		if fi, serr := os.Stat(dir); serr == nil && fi.IsDir() {
			return nil // created concurrently
		}
		return err
	}
	if err := os.Lchown(dir, int(acc.UID), int(acc.GID)); err != nil {
		return err
	}
	return nil
}

// entryInfo describes the file at p without following a final symlink.
// Its error is the *PathError of lstat. Names that are not UTF-8 (any
// sandbox process can create them) are shown with U+FFFD in place of the
// bad bytes: protobuf strings must be UTF-8, and one such name must not
// make a whole directory listing fail.
func entryInfo(p string) (*filesystempb.EntryInfo, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	e := &filesystempb.EntryInfo{
		Name:         validUTF8(fi.Name()),
		Type:         fileType(fi.Mode()),
		Path:         validUTF8(p),
		Size:         fi.Size(),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  fi.Mode().String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = idNames.name("/etc/passwd", st.Uid)
		e.Group = idNames.name("/etc/group", st.Gid)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if target, err := os.Readlink(p); err == nil {
			target = validUTF8(target)
			e.SymlinkTarget = &target
		}
	}
	e.Metadata = readMetadata(p)
	return e, nil
}

// validUTF8 returns s with each run of invalid UTF-8 bytes replaced by U+FFFD.
func validUTF8(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// fileType maps a Go file mode to the protocol's FileType: directories,
// symlinks, and FILE for everything else (regular files, devices, fifos).
func fileType(m fs.FileMode) filesystempb.FileType {
	switch {
	case m.IsDir():
		return filesystempb.FileType_FILE_TYPE_DIRECTORY
	case m&fs.ModeSymlink != 0:
		return filesystempb.FileType_FILE_TYPE_SYMLINK
	default:
		return filesystempb.FileType_FILE_TYPE_FILE
	}
}

// readMetadata returns p's user.e2b.* extended attributes (not following a
// symlink) keyed without the prefix, or nil when there are none or the
// filesystem does not support them.
func readMetadata(p string) map[string]string {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if errors.Is(err, unix.ERANGE) {
		if n, err = unix.Llistxattr(p, nil); err == nil {
			buf = make([]byte, n)
			n, err = unix.Llistxattr(p, buf)
		}
	}
	if err != nil || n <= 0 {
		return nil
	}
	var md map[string]string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		key, ok := strings.CutPrefix(name, xattrPrefix)
		if !ok || key == "" {
			continue
		}
		val := make([]byte, 4096)
		vn, err := unix.Lgetxattr(p, name, val)
		if errors.Is(err, unix.ERANGE) {
			if vn, err = unix.Lgetxattr(p, name, nil); err == nil {
				val = make([]byte, vn)
				vn, err = unix.Lgetxattr(p, name, val)
			}
		}
		if err != nil {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[validUTF8(key)] = validUTF8(string(val[:vn]))
	}
	return md
}

// idNameCache maps numeric uids and gids to names from /etc/passwd and
// /etc/group, re-reading a file when its modification time or size changes.
type idNameCache struct {
	mu    sync.Mutex
	files map[string]*idNameFile
}

// idNameFile is one parsed passwd or group file and the stat it came from.
type idNameFile struct {
	mtime time.Time
	size  int64
	names map[uint32]string
}

// idNames is the agent-wide owner and group name cache.
var idNames = &idNameCache{files: map[string]*idNameFile{}}

// name returns the name for id in file (/etc/passwd or /etc/group, whose
// third colon-separated field is the id), or id in decimal when there is none.
func (c *idNameCache) name(file string, id uint32) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	fi, err := os.Stat(file)
	if err != nil {
		return strconv.FormatUint(uint64(id), 10)
	}
	f := c.files[file]
	if f == nil || !f.mtime.Equal(fi.ModTime()) || f.size != fi.Size() {
		f = &idNameFile{mtime: fi.ModTime(), size: fi.Size(), names: parseIDFile(file)}
		c.files[file] = f
	}
	if n, ok := f.names[id]; ok {
		return n
	}
	return strconv.FormatUint(uint64(id), 10)
}

// parseIDFile reads a passwd- or group-format file into id -> name; the
// first name listed for an id wins. Unreadable files yield an empty map.
func parseIDFile(file string) map[uint32]string {
	names := map[uint32]string{}
	f, err := os.Open(file)
	if err != nil {
		return names
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.SplitN(sc.Text(), ":", 4)
		if len(fields) < 3 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		id, err := strconv.ParseUint(fields[2], 10, 32)
		if err != nil {
			continue
		}
		if _, ok := names[uint32(id)]; !ok {
			names[uint32(id)] = fields[0]
		}
	}
	return names
}

// watcherTable holds the polled watchers by id.
type watcherTable struct {
	mu sync.Mutex
	m  map[string]*polledWatcher
}

// newWatcherTable returns an empty table.
func newWatcherTable() *watcherTable { return &watcherTable{m: map[string]*polledWatcher{}} }

// get returns the watcher with id, or a not_found error.
func (t *watcherTable) get(id string) (*polledWatcher, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if pw := t.m[id]; pw != nil {
		return pw, nil
	}
	return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", id))
}

// remove deletes id from the table and returns its watcher, or nil.
func (t *watcherTable) remove(id string) *polledWatcher {
	t.mu.Lock()
	defer t.mu.Unlock()
	pw := t.m[id]
	delete(t.m, id)
	return pw
}
