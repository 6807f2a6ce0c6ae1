package snapshot

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/changes"
	"github.com/forkbox/forkbox/storage/seal"
	"github.com/forkbox/forkbox/store"
	"github.com/forkbox/forkbox/tenancy"
)

// Imports. A fork, create or restore from a snapshot id this host does
// not have asks the replicas whether the fleet has a replicated copy of
// it; if so the copy is pulled into the bounded local cache and checked
// against the digest the fleet's directory holds (Replicas.OpenFiles:
// the manifest's digest, then every sealed file's sha256) before any of
// it is read, decrypted (every chunk authenticated) and applied to a
// scratch layer of its template, which is then snapshotted under the
// snapshot's own id and recorded as this host's: from then on it forks
// and restores as any local snapshot, and its children are this host's
// sessions. A memory checkpoint comes with it (pulled, verified, copied
// into the memory directory still sealed). A copy that fails any check
// is refused (ErrConflict) and nothing of it is kept.

// importRemote imports snapshot id from the fleet for ctx's caller (see
// above); ErrNotFound when the fleet has no replicated copy of it (or the
// caller's tenant does not own it). One import runs at a time; ctx's
// end stops a caller waiting for its turn too.
func (s *Service) importRemote(ctx context.Context, id string) (*node.Snapshot, error) {
	select {
	case s.importing <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-s.importing }()
	if sn, err := s.store.GetSnapshot(ctx, id); err == nil {
		// Imported meanwhile (maybe for another tenant's caller).
		if !tenancy.Owns(ctx, sn.Tenant) {
			return nil, errdefs.Newf(errdefs.ErrNotFound, "snapshot %q", id)
		}
		return sn, nil
	}
	tenant, digest, err := s.replicas.Locate(ctx, id)
	if err != nil {
		return nil, err
	}
	if tenant == "" {
		tenant = store.DefaultTenant
	}
	if !tenancy.Owns(ctx, tenant) {
		return nil, errdefs.Newf(errdefs.ErrNotFound, "snapshot %q", id)
	}
	began := time.Now()
	dir, release, err := s.replicas.OpenFiles(ctx, id, digest)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s from the fleet: %w", id, err)
	}
	defer release()
	pulled := time.Now()
	sn, err := s.importFiles(ctx, id, dir, digest)
	if err != nil {
		return nil, fmt.Errorf("snapshot %s from the fleet: %w", id, err)
	}
	s.log.Info("snapshot imported from the fleet", "snapshot", id, "template", sn.Template, "memory", sn.MemoryDriver != "",
		"pull_ms", ms(pulled.Sub(began)), "import_ms", ms(time.Since(pulled)))
	return sn, nil
}

// importFiles imports the verified export in dir (manifest digest
// digest) as snapshot id.
func (s *Service) importFiles(ctx context.Context, id, dir, digest string) (_ *node.Snapshot, err error) {
	data, err := os.ReadFile(filepath.Join(dir, seal.ManifestName))
	if err != nil {
		return nil, err
	}
	m, err := seal.ParseManifest(data, digest)
	if err != nil {
		return nil, err
	}
	files := map[string]seal.File{}
	for _, f := range m.Files {
		files[f.Name] = f
	}
	recFile, ok1 := files[recordName]
	archive, ok2 := files[filesArchive]
	if !ok1 || !ok2 || len(files) != 2 {
		return nil, errdefs.Newf(errdefs.ErrConflict, "the export is not a files snapshot (it holds %d files)", len(files))
	}
	var buf bytes.Buffer
	if err := seal.OpenStream(s.key, filepath.Join(dir, recordName), recFile, &limitWriter{w: &buf, n: maxRecordBytes}); err != nil {
		return nil, err
	}
	var rec exportRecord
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		return nil, errdefs.Newf(errdefs.ErrConflict, "the export's record: %v", err)
	}
	if rec.Format != exportFormat || rec.Snapshot.ID != id {
		return nil, errdefs.Newf(errdefs.ErrConflict, "the export is of format %d, snapshot %q", rec.Format, rec.Snapshot.ID)
	}
	tpl := rec.Snapshot.Template
	if !s.core.TemplateUsable(ctx, tpl) {
		return nil, errdefs.Newf(errdefs.ErrConflict, "its template %q is not on this host", tpl)
	}
	if got := s.templateDigest(ctx, tpl); got != rec.TemplateDigest {
		return nil, errdefs.Newf(errdefs.ErrConflict, "its template %q is %q here, %q where it was taken", tpl, got, rec.TemplateDigest)
	}
	if rec.Snapshot.MemoryDriver != "" {
		if rec.Source == nil {
			return nil, errdefs.Newf(errdefs.ErrConflict, "the export of a memory snapshot names no source session")
		}
		if err := s.importMemory(ctx, id, rec.Snapshot.MemoryDigest); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				os.RemoveAll(s.memoryDir(id))
			}
		}()
	}
	// The import's mark (resumeCopies copies no imported snapshot) and a
	// memory snapshot's source session.
	if err := os.MkdirAll(s.layout.FleetImports(), 0o700); err != nil {
		return nil, err
	}
	src := rec.Source
	if src == nil {
		src = &sourceSession{}
	}
	mark, err := json.Marshal(src)
	if err != nil {
		return nil, err
	}
	if err := storage.WriteFileSynced(s.importedSource(id), mark); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.Remove(s.importedSource(id))
		}
	}()
	layer, err := s.scratchLayer(ctx, tpl)
	if err != nil {
		return nil, err
	}
	defer layer.remove()
	if err := s.applyArchive(ctx, filepath.Join(dir, filesArchive), archive, layer.root); err != nil {
		return nil, err
	}
	info, err := s.storage.Snapshot(ctx, layer.id, id, nil)
	if err != nil {
		return nil, err
	}
	sn := rec.Snapshot
	sn.Parent, sn.Template, sn.Storage, sn.SizeBytes, sn.Digest = "", info.Template, s.storage.Name(), info.SizeBytes, info.Digest
	sn.Provisional = false
	if err := s.store.CreateSnapshot(ctx, &sn); err != nil {
		_ = s.storage.RemoveSnapshot(context.WithoutCancel(ctx), id)
		return nil, err
	}
	return &sn, nil
}

// applyArchive decrypts the sealed change archive at path (manifest
// entry f) and applies it to the tree at root as it streams.
func (s *Service) applyArchive(ctx context.Context, path string, f seal.File, root string) error {
	t, err := changes.OpenTree(root)
	if err != nil {
		return err
	}
	defer t.Close()
	pr, pw := io.Pipe()
	opened := make(chan error, 1)
	go func() {
		err := seal.OpenStream(s.key, path, f, pw)
		pw.CloseWithError(err)
		opened <- err
	}()
	err = changes.ApplyTar(ctx, pr, t, changes.ApplyOptions{PrivilegedBelow: storage.DefaultIDShift.UIDBase})
	if err == nil {
		// The seal's own checks (the file's sha256 and size) end it.
		_, err = io.Copy(io.Discard, pr)
	}
	pr.CloseWithError(errors.New("the import stopped reading"))
	if oerr := <-opened; oerr != nil && (err == nil || errors.Is(oerr, errdefs.ErrConflict)) {
		err = oerr
	}
	return err
}

// importMemory pulls snapshot id's sealed memory checkpoint (verified
// against digest) and copies it, still sealed, into its memory
// directory.
func (s *Service) importMemory(ctx context.Context, id, digest string) error {
	if digest == "" {
		return errdefs.Newf(errdefs.ErrConflict, "its memory checkpoint was not sealed when it was exported")
	}
	src, release, err := s.replicas.OpenMemory(ctx, id, digest)
	if err != nil {
		return fmt.Errorf("its memory checkpoint: %w", err)
	}
	defer release()
	if err := os.MkdirAll(s.layout.MemorySnapshots(), 0o700); err != nil {
		return err
	}
	dst := s.memoryDir(id)
	tmp := filepath.Join(s.layout.MemorySnapshots(), ".import-"+id)
	os.RemoveAll(tmp)
	if err := linkOrCopyDir(src, tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return nil
}

// linkOrCopyDir makes the new directory dst (0700) with the regular files
// of the flat directory src: hard links where both are on one
// filesystem (sealed files are never written again), else copies.
func linkOrCopyDir(src, dst string) error {
	des, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	for _, de := range des {
		if !de.Type().IsRegular() {
			continue
		}
		from, to := filepath.Join(src, de.Name()), filepath.Join(dst, de.Name())
		if os.Link(from, to) == nil {
			continue
		}
		if err := copyFile(from, to); err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies regular file from to the new file to (0600, synced).
func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if _, err := io.Copy(out, in); err != nil {
		return err
	}
	if err := out.Sync(); err != nil {
		return err
	}
	return out.Close()
}

// limitWriter writes at most n bytes to w; more is ErrResourceExhausted.
type limitWriter struct {
	w io.Writer
	n int64
}

func (l *limitWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > l.n {
		return 0, errdefs.Newf(errdefs.ErrResourceExhausted, "more than %d bytes", maxRecordBytes)
	}
	l.n -= int64(len(p))
	return l.w.Write(p)
}

// importedSource is the file that marks snapshot id imported from
// another host and keeps, for a memory snapshot, its source session
// (sourceSession).
func (s *Service) importedSource(id string) string {
	return filepath.Join(s.layout.FleetImports(), id+".json")
}

// SourceNetwork implements sandbox.SnapshotHooks: the network of the
// session memory snapshot sn was taken of, from this host's store, or
// for a snapshot imported from another host from what its export said.
func (s *Service) SourceNetwork(ctx context.Context, sn *node.Snapshot) (*node.Network, error) {
	src, err := s.store.GetSession(ctx, sn.SessionID)
	if err == nil {
		return src.Network, nil
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		return nil, err
	}
	data, rerr := os.ReadFile(s.importedSource(sn.ID))
	if errors.Is(rerr, os.ErrNotExist) {
		return nil, err
	}
	if rerr != nil {
		return nil, rerr
	}
	var ss sourceSession
	if err := json.Unmarshal(data, &ss); err != nil {
		return nil, fmt.Errorf("imported source of snapshot %s: %w", sn.ID, err)
	}
	return ss.Network, nil
}

// imported reports whether snapshot id was imported from another host.
func (s *Service) imported(id string) bool {
	_, err := os.Lstat(s.importedSource(id))
	return err == nil
}
