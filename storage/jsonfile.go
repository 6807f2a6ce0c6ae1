package storage

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/forkbox/forkbox/errdefs"
)

// ReadJSON decodes the JSON file at path into v: the metadata files of
// templates and of the storage drivers. A missing file is ErrNotFound
// naming what (e.g. `snapshot "s1"`); a file that does not decode is
// ErrInternal.
func ReadJSON(path string, v any, what string) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return errdefs.Newf(errdefs.ErrNotFound, "%s", what)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: corrupt metadata %s: %v: %w", what, path, err, errdefs.ErrInternal)
	}
	return nil
}

// WriteJSON writes v, indented, as the file path with mode, atomically: a
// temporary file beside path, synced, then renamed over it, so a reader
// sees the old file or the new one, never a part. A full disk (ENOSPC,
// EDQUOT) is ErrInsufficientStorage.
func WriteJSON(path string, v any, mode os.FileMode) error {
	return writeJSON(path, v, mode, true)
}

// WriteJSONUnsynced is WriteJSON without the sync: the file is replaced
// atomically for readers, but a host crash may leave it empty or old. It
// is for what does not outlive a host crash anyway (a sandbox's writable
// layer's metadata: the sandbox dies with the host, and its layer is
// then removed, which does not read it), where a sync per sandbox would
// wait for the filesystem's other commits (on btrfs, every concurrent
// snapshot's: tens of ms in a fork).
func WriteJSONUnsynced(path string, v any, mode os.FileMode) error {
	return writeJSON(path, v, mode, false)
}

func writeJSON(path string, v any, mode os.FileMode, sync bool) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode %s: %v: %w", path, err, errdefs.ErrInternal)
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return writeErr(path, err)
	}
	tmp := f.Name()
	_, err = f.Write(append(b, '\n'))
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return writeErr(path, err)
	}
	return nil
}

func writeErr(path string, err error) error {
	if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.EDQUOT) {
		return fmt.Errorf("write %s: %w: %w", path, err, errdefs.ErrInsufficientStorage)
	}
	return fmt.Errorf("write %s: %w", path, err)
}

// WriteFileSynced writes data to path, a new file (mode 0600; an existing
// path is an error), and fsyncs it before closing.
func WriteFileSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
