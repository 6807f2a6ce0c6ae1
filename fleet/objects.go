package fleet

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/seal"
)

// Objects keeps sealed snapshot directories (seal.SealDir's output: the
// sealed files and their manifest) off the host that made them, so that
// another host can pull them. The bytes are stored as sealed, still
// encrypted with the fleet's snapshot key; integrity is anchored in the
// manifest digest the snapshot's record holds, which every copy is
// checked against at both ends.
type Objects interface {
	// Put copies the sealed directory dir, whose manifest digest is
	// digest, as snapshot id's objects. Each file's bytes are hashed as
	// they are read and checked against the manifest (a file changed on
	// disk is ErrConflict and nothing of id is left stored); the manifest
	// goes last, so a snapshot whose manifest is stored is whole. Putting
	// an id again replaces it.
	Put(ctx context.Context, id, dir, digest string) error
	// Get copies snapshot id into dst, which must not exist, checking
	// the manifest against digest and each file against the manifest as
	// it is written. ErrNotFound when id is not stored; ErrConflict
	// ("failed its integrity check") on any mismatch. On any error dst
	// does not exist: nothing half-copied is left.
	Get(ctx context.Context, id, digest, dst string) error
	// Delete removes snapshot id's objects; an id not stored is fine.
	Delete(ctx context.Context, id string) error
}

// SnapshotsBucket is the JetStream object store bucket of sealed
// snapshots: objects "ID/NAME", one per file of snapshot ID's sealed
// directory (NAME seal.ManifestName for its manifest).
const SnapshotsBucket = "forkbox-snapshots"

// ObjectChunkBytes is the chunk size objects are stored in (each chunk
// one JetStream message; below the server's 1 MiB default max payload).
const ObjectChunkBytes = 512 << 10

// sha256Key is the object metadata key holding the hex sha256 of the
// object's bytes, as the writer hashed them.
const sha256Key = "forkbox-sha256"

// JetStreamObjects is Objects on the fleet's JetStream object store
// (bucket SnapshotsBucket, replicated Fleet.Replicas() times). Safe for
// concurrent use.
type JetStreamObjects struct {
	obs jetstream.ObjectStore
}

var _ Objects = (*JetStreamObjects)(nil)

// OpenObjects opens (creating when missing) the snapshot object store on
// f, waiting up to ctx for a cluster still electing its leaders.
func OpenObjects(ctx context.Context, f *Fleet) (*JetStreamObjects, error) {
	var obs jetstream.ObjectStore
	err := retry(ctx, func(ctx context.Context) error {
		var err error
		obs, err = f.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
			Bucket: SnapshotsBucket, Description: "forkbox sealed snapshots (still encrypted)",
			Replicas: f.replicas, Storage: jetstream.FileStorage,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: snapshot object store: %w", err)
	}
	return &JetStreamObjects{obs: obs}, nil
}

// objectName is the name of file name of snapshot id.
func objectName(id, name string) string { return id + "/" + name }

// Put implements Objects.Put.
func (o *JetStreamObjects) Put(ctx context.Context, id, dir, digest string) (err error) {
	if err := ValidID("snapshot id", id); err != nil {
		return err
	}
	data, err := os.ReadFile(filepath.Join(dir, seal.ManifestName))
	if err != nil {
		return fmt.Errorf("fleet: put snapshot %s: %w", id, err)
	}
	m, err := seal.ParseManifest(data, digest)
	if err != nil {
		return err
	}
	// A failed Put leaves nothing of id: a manifest of an earlier Put
	// first, so no reader takes id as whole while its files change.
	if err := o.delete(ctx, id, m); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = o.delete(context.WithoutCancel(ctx), id, m)
		}
	}()
	for _, f := range m.Files {
		if err := o.putFile(ctx, objectName(id, f.Name), filepath.Join(dir, f.Name), f.SHA256); err != nil {
			return err
		}
	}
	sum := sha256.Sum256(data)
	_, err = o.obs.Put(ctx, jetstream.ObjectMeta{Name: objectName(id, seal.ManifestName),
		Metadata: map[string]string{sha256Key: hex.EncodeToString(sum[:])},
		Opts:     &jetstream.ObjectMetaOptions{ChunkSize: ObjectChunkBytes}}, bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%w: fleet: put snapshot %s: %v", errdefs.ErrUnavailable, id, err)
	}
	return nil
}

// putFile stores the file at path as object name, hashing its bytes as
// they are read; a hash other than want is ErrConflict.
func (o *JetStreamObjects) putFile(ctx context.Context, name, path, want string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("fleet: put %s: %w", name, err)
	}
	defer f.Close()
	h := sha256.New()
	_, err = o.obs.Put(ctx, jetstream.ObjectMeta{Name: name, Metadata: map[string]string{sha256Key: want},
		Opts: &jetstream.ObjectMetaOptions{ChunkSize: ObjectChunkBytes}}, io.TeeReader(f, h))
	if err != nil {
		return fmt.Errorf("%w: fleet: put %s: %v", errdefs.ErrUnavailable, name, err)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return errdefs.Newf(errdefs.ErrConflict, "snapshot file %s failed its integrity check before upload: sha256 %s, manifest %s", name, got, want)
	}
	return nil
}

// Get implements Objects.Get.
func (o *JetStreamObjects) Get(ctx context.Context, id, digest, dst string) (err error) {
	if err := ValidID("snapshot id", id); err != nil {
		return err
	}
	if _, err := os.Lstat(dst); err == nil {
		return errdefs.Newf(errdefs.ErrConflict, "fleet: get snapshot %s: destination exists", id)
	}
	// The manifest is small: each attempt has a few seconds, so one
	// asked while the stream elects a leader is asked again.
	var data []byte
	err = retry(ctx, func(ctx context.Context) error {
		var err error
		data, err = o.obs.GetBytes(ctx, objectName(id, seal.ManifestName))
		return err
	})
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return errdefs.Newf(errdefs.ErrNotFound, "snapshot %s is not in the fleet's object store", id)
	}
	if errors.Is(err, jetstream.ErrDigestMismatch) {
		return errdefs.Newf(errdefs.ErrConflict, "snapshot %s: its manifest object failed its integrity check", id)
	}
	if err != nil {
		return fmt.Errorf("%w: fleet: get snapshot %s: %v", errdefs.ErrUnavailable, id, err)
	}
	m, err := seal.ParseManifest(data, digest)
	if err != nil {
		return err
	}
	tmp := filepath.Join(filepath.Dir(dst), "."+filepath.Base(dst)+".part-"+randHex(6))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(tmp)
		}
	}()
	for _, f := range m.Files {
		if err := o.getFile(ctx, objectName(id, f.Name), filepath.Join(tmp, f.Name), f); err != nil {
			return err
		}
	}
	if err := storage.WriteFileSynced(filepath.Join(tmp, seal.ManifestName), data); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// getFile writes object name to path (created 0600, fsynced), hashing
// its bytes as they arrive; a hash other than f's is ErrConflict, and so
// is an object longer than f's sealed size (stopped there: an altered
// object cannot fill the disk before its hash is checked).
func (o *JetStreamObjects) getFile(ctx context.Context, name, path string, f seal.File) error {
	want, limit := f.SHA256, seal.SealedSize(f.Size)
	r, err := o.obs.Get(ctx, name)
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return errdefs.Newf(errdefs.ErrConflict, "snapshot file %s failed its integrity check: missing from the object store", name)
	}
	if err != nil {
		return fmt.Errorf("%w: fleet: get %s: %v", errdefs.ErrUnavailable, name, err)
	}
	defer r.Close()
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(out, h), io.LimitReader(r, limit+1))
	if err != nil {
		if errors.Is(err, jetstream.ErrDigestMismatch) {
			return errdefs.Newf(errdefs.ErrConflict, "snapshot file %s failed its integrity check: its chunks do not match the object's digest", name)
		}
		return fmt.Errorf("%w: fleet: get %s: %v", errdefs.ErrUnavailable, name, err)
	}
	if n > limit {
		return errdefs.Newf(errdefs.ErrConflict, "snapshot file %s failed its integrity check: more than the %d bytes its manifest makes it", name, limit)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want {
		return errdefs.Newf(errdefs.ErrConflict, "snapshot file %s failed its integrity check: sha256 %s, manifest %s", name, got, want)
	}
	if err := out.Sync(); err != nil {
		return err
	}
	return out.Close()
}

// Delete implements Objects.Delete.
func (o *JetStreamObjects) Delete(ctx context.Context, id string) error {
	if err := ValidID("snapshot id", id); err != nil {
		return err
	}
	// The objects of id: those the stored manifest lists (whatever its
	// digest), plus any object under id/ a failed Put left.
	infos, err := o.obs.List(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoObjectsFound) {
		return fmt.Errorf("%w: fleet: delete snapshot %s: %v", errdefs.ErrUnavailable, id, err)
	}
	prefix := id + "/"
	// The manifest first: id stops being whole before its files go.
	names := []string{objectName(id, seal.ManifestName)}
	for _, info := range infos {
		if len(info.Name) > len(prefix) && info.Name[:len(prefix)] == prefix && info.Name != names[0] {
			names = append(names, info.Name)
		}
	}
	return o.deleteNames(ctx, names)
}

// delete removes id's manifest and the objects of the files m lists.
func (o *JetStreamObjects) delete(ctx context.Context, id string, m *seal.Manifest) error {
	names := []string{objectName(id, seal.ManifestName)}
	for _, f := range m.Files {
		names = append(names, objectName(id, f.Name))
	}
	return o.deleteNames(ctx, names)
}

func (o *JetStreamObjects) deleteNames(ctx context.Context, names []string) error {
	for _, n := range names {
		if err := o.obs.Delete(ctx, n); err != nil && !errors.Is(err, jetstream.ErrObjectNotFound) {
			return fmt.Errorf("%w: fleet: delete %s: %v", errdefs.ErrUnavailable, n, err)
		}
	}
	return nil
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
