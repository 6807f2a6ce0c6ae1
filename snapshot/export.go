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

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/changes"
	"github.com/forkbox/forkbox/storage/seal"
)

// Files exports. A snapshot's files travel to other hosts as a sealed
// directory (seal's format, encrypted with the snapshot key every host of
// the fleet shares) of two files: filesArchive, the change archive
// (changes.WriteTar) from its template's tree to the snapshot's whole
// tree, parents included, so the export stands alone; and recordName,
// its record (exportRecord). The manifest digest of that directory is
// what the fleet's directory records and every copy is checked against.
// A change archive was chosen over a tar of the whole tree (the
// template's files every host already has would travel with every
// snapshot) and over `btrfs send` (overlay hosts have no such stream, a
// send stream needs its parent subvolume on the receiving side by uuid,
// and a receive runs commands the stream chooses with the host's
// privileges): the same format serves both drivers and is applied
// beneath the layer, through no symlink.

const (
	// filesArchive is the export's change archive.
	filesArchive = "files.tar"
	// recordName is the export's record.
	recordName = "record.json"
	// exportFormat is the version of exportRecord and the archive.
	exportFormat = 1
	// maxRecordBytes bounds a record read back (it is a few hundred).
	maxRecordBytes = 1 << 20
)

// exportRecord is what a host needs, beside the files, to take a
// snapshot of another host's as its own.
type exportRecord struct {
	// Format is exportFormat.
	Format int `json:"format"`
	// Snapshot is the snapshot's record on the host that took it
	// (template, tier, parent, memory state and digest, tenant, name).
	Snapshot node.Snapshot `json:"snapshot"`
	// Chain is the snapshot's parents, nearest first (the files of all
	// of them are in the archive: the import stands alone).
	Chain []string `json:"chain,omitempty"`
	// TemplateDigest is the image digest of the template the archive's
	// changes apply to ("" for a template built in): an importer whose
	// template of that name has another digest refuses the export.
	TemplateDigest string `json:"template_digest,omitempty"`
	// Source is what a memory restore needs of the session the snapshot
	// was taken of (nil for a files snapshot).
	Source *sourceSession `json:"source,omitempty"`
}

// sourceSession is what a host that imports a memory snapshot keeps of
// its session (FleetImports/ID.json): a restore's network must have the
// shape the checkpoint's had.
type sourceSession struct {
	Network *node.Network `json:"network,omitempty"`
}

// layerTrees is the storage driver's view of whole trees, which exports
// need (both drivers have it).
func (s *Service) layerTrees() (storage.Trees, error) {
	t, ok := s.storage.(storage.Trees)
	if !ok {
		return nil, errdefs.Newf(errdefs.ErrUnavailable, "storage driver %s shows no trees: snapshots cannot be replicated", s.storage.Name())
	}
	return t, nil
}

// templateDigest returns template name's image digest ("" when it has
// none: built in, or unknown to the store).
func (s *Service) templateDigest(ctx context.Context, name string) string {
	t, err := s.store.GetTemplate(ctx, name)
	if err != nil {
		return ""
	}
	return t.Digest
}

// chain returns sn's parents, nearest first.
func (s *Service) chain(ctx context.Context, sn *node.Snapshot) []string {
	var out []string
	for p := sn.Parent; p != "" && len(out) < 1024; {
		out = append(out, p)
		ps, err := s.store.GetSnapshot(ctx, p)
		if err != nil {
			break
		}
		p = ps.Parent
	}
	return out
}

// exportFiles seals snapshot sn's files export into the new directory
// dir and returns its manifest digest and the archive's plaintext bytes.
// It reads the snapshot's tree and a scratch layer of its template (made
// and removed here) and streams: memory is a copy buffer, a seal chunk
// and the list of changed paths (at most changes.DefaultMaxChanges; more
// is ErrResourceExhausted). On error dir is removed.
func (s *Service) exportFiles(ctx context.Context, sn *node.Snapshot, dir string) (digest string, n int64, err error) {
	trees, err := s.layerTrees()
	if err != nil {
		return "", 0, err
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return "", 0, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", 0, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	base, err := s.scratchLayer(ctx, sn.Template)
	if err != nil {
		return "", 0, err
	}
	defer base.remove()
	snapDir, release, err := trees.SnapshotTree(ctx, sn.ID)
	if err != nil {
		return "", 0, err
	}
	defer release()
	bt, err := changes.OpenTree(base.root)
	if err != nil {
		return "", 0, err
	}
	defer bt.Close()
	nt, err := changes.OpenTree(snapDir)
	if err != nil {
		return "", 0, err
	}
	defer nt.Close()
	d, err := changes.Diff(ctx, bt, nt, changes.Options{})
	if err != nil {
		return "", 0, fmt.Errorf("changes of snapshot %s over its template: %w", sn.ID, err)
	}
	pr, pw := io.Pipe()
	wrote := make(chan error, 1)
	go func() {
		err := changes.WriteTar(ctx, pw, nt, d.Changes)
		pw.CloseWithError(err)
		wrote <- err
	}()
	archive, err := seal.SealStream(s.key, pr, filepath.Join(dir, filesArchive), filesArchive)
	pr.CloseWithError(errors.New("the seal stopped reading"))
	if werr := <-wrote; err == nil && werr != nil {
		err = werr
	}
	if err != nil {
		return "", 0, fmt.Errorf("archive of snapshot %s: %w", sn.ID, err)
	}
	er := exportRecord{Format: exportFormat, Snapshot: *sn, Chain: s.chain(ctx, sn), TemplateDigest: s.templateDigest(ctx, sn.Template)}
	if sn.MemoryDriver != "" {
		net, err := s.SourceNetwork(ctx, sn)
		if err != nil {
			return "", 0, err
		}
		er.Source = &sourceSession{Network: net}
	}
	rec, err := json.Marshal(er)
	if err != nil {
		return "", 0, err
	}
	recFile, err := seal.SealStream(s.key, bytes.NewReader(rec), filepath.Join(dir, recordName), recordName)
	if err != nil {
		return "", 0, err
	}
	digest, err = seal.WriteManifest(dir, []seal.File{archive, recFile})
	if err != nil {
		return "", 0, err
	}
	return digest, archive.Size, nil
}

// scratch is a writable layer made for an export or an import, removed
// once done (a daemon that died meanwhile sweeps it at start-up: no
// session owns it).
type scratch struct {
	s    *Service
	id   string
	root string
}

// scratchLayer prepares a scratch layer of template.
func (s *Service) scratchLayer(ctx context.Context, template string) (*scratch, error) {
	id := "replica-" + node.NewID()
	root, err := s.storage.Prepare(ctx, id, storage.Source{Template: template}, 0)
	if err != nil {
		return nil, fmt.Errorf("scratch layer of template %s: %w", template, err)
	}
	return &scratch{s: s, id: id, root: root}, nil
}

// remove removes the scratch layer (logged when it fails).
func (l *scratch) remove() {
	if err := l.s.storage.Remove(context.WithoutCancel(l.s.bgCtx), l.id); err != nil {
		l.s.log.Warn("remove a scratch layer", "layer", l.id, "err", err)
	}
}
