// Package seal keeps files encrypted and authenticated at rest: memory
// checkpoints hold everything a sandbox had in memory, so they are never
// written to disk in the clear for longer than a checkpoint or a restore
// takes.
//
// A sealed file is the magic "FBXSEAL1", a random 32-byte salt, then the
// plaintext in chunks of ChunkSize bytes, each sealed with AES-256-GCM
// (16-byte tag) under a per-file key, HMAC-SHA256(master key, salt). A
// chunk's 12-byte nonce is its index (8 bytes, big-endian), three zero
// bytes and a last-chunk flag, and its additional data is the file's name,
// so chunks cannot be reordered, dropped, cut off at the end or moved to
// another file without Open noticing. A directory sealed with SealDir has
// a manifest.json listing each file's name, plaintext size and the sha256
// of its sealed bytes; SealDir returns the manifest's own sha256, which
// the caller stores elsewhere (the database), so that a changed manifest
// is refused too.
package seal

import (
	"bufio"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// ChunkSize is the plaintext bytes per sealed chunk (1 MiB).
const ChunkSize = 1 << 20

// KeyEnv is the environment variable that, when set, holds the master key
// as 64 hex digits and overrides the key file (for keys kept in a secret
// store or KMS and handed to the daemon in its environment).
const KeyEnv = "FORKBOX_SNAPSHOT_KEY"

const (
	magic        = "FBXSEAL1"
	saltSize     = 32
	tagSize      = 16
	manifestName = ManifestName
)

// ManifestName is the name of a sealed directory's manifest file.
const ManifestName = "manifest.json"

// Key is a 32-byte AES-256 master key.
type Key [32]byte

// LoadKey returns the master key: from KeyEnv when it is set, else from
// the file at path, which is created (32 random bytes, mode 0600) when
// missing. A key file of another size, or a KeyEnv that is not 64 hex
// digits, is an error.
func LoadKey(path string) (*Key, error) {
	var k Key
	if v := os.Getenv(KeyEnv); v != "" {
		b, err := hex.DecodeString(strings.TrimSpace(v))
		if err != nil || len(b) != len(k) {
			return nil, fmt.Errorf("%s: want %d hex digits", KeyEnv, 2*len(k))
		}
		copy(k[:], b)
		return &k, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		if _, err := rand.Read(k[:]); err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if errors.Is(err, os.ErrExist) {
			return LoadKey(path) // made meanwhile by someone else
		}
		if err != nil {
			return nil, err
		}
		if _, err := f.Write(k[:]); err != nil {
			f.Close()
			return nil, err
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, err
		}
		return &k, f.Close()
	}
	if err != nil {
		return nil, err
	}
	if len(b) != len(k) {
		return nil, fmt.Errorf("snapshot key %s: %d bytes, want %d", path, len(b), len(k))
	}
	copy(k[:], b)
	return &k, nil
}

// Manifest lists the files of a sealed directory.
type Manifest struct {
	Files []File `json:"files"`
}

// File is one sealed file.
type File struct {
	// Name is its name in the directory (no path separators).
	Name string `json:"name"`
	// Size is its plaintext size in bytes.
	Size int64 `json:"size"`
	// SHA256 is the hex sha256 of the sealed file's bytes.
	SHA256 string `json:"sha256"`
}

// SealDir seals every regular file of src (not recursing) into dst, which
// must not exist, and writes dst's manifest. It returns the manifest's
// digest ("sha256:<hex>") and the total plaintext bytes. On error dst is
// removed.
func SealDir(key *Key, src, dst string) (digest string, bytes int64, err error) {
	return SealDirCopy(key, src, dst, "")
}

// SealDirCopy is SealDir that also writes, in the same pass, each file's
// plaintext as read into the new directory plain (mode 0700, files 0600;
// none when plain is ""), so that a caller wanting the clear copy too
// (the snapshot service's image cache) reads the source once. On error
// plain is removed too.
func SealDirCopy(key *Key, src, dst, plain string) (digest string, bytes int64, err error) {
	entries, err := os.ReadDir(src)
	if err != nil {
		return "", 0, err
	}
	if err := os.Mkdir(dst, 0o700); err != nil {
		return "", 0, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dst)
		}
	}()
	if plain != "" {
		if err := os.Mkdir(plain, 0o700); err != nil {
			return "", 0, err
		}
		defer func() {
			if err != nil {
				os.RemoveAll(plain)
			}
		}()
	}
	var m Manifest
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		var copyTo string
		if plain != "" {
			copyTo = filepath.Join(plain, e.Name())
		}
		f, err := sealFile(key, filepath.Join(src, e.Name()), filepath.Join(dst, e.Name()), e.Name(), copyTo)
		if err != nil {
			return "", 0, fmt.Errorf("seal %s: %w", e.Name(), err)
		}
		m.Files = append(m.Files, f)
		bytes += f.Size
	}
	data, err := json.Marshal(m)
	if err != nil {
		return "", 0, err
	}
	if err := storage.WriteFileSynced(filepath.Join(dst, manifestName), data); err != nil {
		return "", 0, err
	}
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:]), bytes, nil
}

// OpenDir checks the sealed directory dir against digest (from SealDir)
// and decrypts every file into out (created, mode 0700). Each file's
// sha256 and every chunk's tag are checked; a missing, truncated,
// reordered or altered file fails with ErrConflict ("failed its integrity
// check"), and then out is removed: nothing half-decrypted is left.
func OpenDir(key *Key, dir, digest, out string) (err error) {
	data, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		return corrupt("manifest: %v", err)
	}
	m, err := ParseManifest(data, digest)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o700); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(out)
		}
	}()
	for _, f := range m.Files {
		if err := openFile(key, filepath.Join(dir, f.Name), filepath.Join(out, f.Name), f); err != nil {
			return err
		}
	}
	return nil
}

// ParseManifest checks a sealed directory's manifest bytes data against
// digest (SealDir's) and returns the manifest. A manifest of another
// digest, one that does not parse, or one naming a file that is not a
// plain name in the directory fails with ErrConflict ("failed its
// integrity check"). Copies of a sealed directory (the fleet's object
// store) check each file's bytes against the SHA256 it lists.
func ParseManifest(data []byte, digest string) (*Manifest, error) {
	sum := sha256.Sum256(data)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != digest {
		return nil, corrupt("manifest digest %s, recorded %s", got, digest)
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, corrupt("manifest: %v", err)
	}
	for _, f := range m.Files {
		if f.Name == "" || f.Name != filepath.Base(f.Name) || f.Name == manifestName || f.Name[0] == '.' {
			return nil, corrupt("manifest names %q", f.Name)
		}
	}
	return &m, nil
}

// corrupt is an integrity failure.
func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: sealed snapshot failed its integrity check: %s", errdefs.ErrConflict, fmt.Sprintf(format, args...))
}

// fileAEAD returns the AES-256-GCM of a file with salt.
func fileAEAD(key *Key, salt []byte) (cipher.AEAD, error) {
	mac := hmac.New(sha256.New, key[:])
	mac.Write(salt)
	block, err := aes.NewCipher(mac.Sum(nil))
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// nonce returns chunk i's nonce.
func nonce(i uint64, last bool) []byte {
	n := make([]byte, 12)
	binary.BigEndian.PutUint64(n, i)
	if last {
		n[11] = 1
	}
	return n
}

// sealFile seals src into dst (created, 0600, fsynced), and copies its
// plaintext into the new file copyTo (0600, not synced) unless it is "".
func sealFile(key *Key, src, dst, name, copyTo string) (File, error) {
	in, err := os.Open(src)
	if err != nil {
		return File{}, err
	}
	defer in.Close()
	var clear *os.File
	if copyTo != "" {
		if clear, err = os.OpenFile(copyTo, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600); err != nil {
			return File{}, err
		}
		defer clear.Close()
	}
	var cw io.Writer
	if clear != nil {
		cw = clear
	}
	f, err := sealTo(key, in, dst, name, cw)
	if err != nil {
		return File{}, err
	}
	if clear != nil {
		if err := clear.Close(); err != nil {
			return File{}, err
		}
	}
	return f, nil
}

// SealStream seals what r yields, up to its EOF, into the new file dst
// (created 0600, fsynced) as the sealed file name, in SealDir's format,
// and returns its manifest entry (WriteManifest lists it). Memory is one
// chunk, whatever r's length. On error dst may be left; the caller
// removes the directory it seals into.
func SealStream(key *Key, r io.Reader, dst, name string) (File, error) {
	if name == "" || name != filepath.Base(name) || name == manifestName || name[0] == '.' {
		return File{}, errdefs.Newf(errdefs.ErrInvalidArgument, "sealed file name %q: not a plain name", name)
	}
	return sealTo(key, r, dst, name, nil)
}

// WriteManifest writes the manifest of files into dir (fsynced) and
// returns its digest ("sha256:<hex>"), as SealDir does for the files it
// sealed: for a directory whose files were sealed one by one with
// SealStream.
func WriteManifest(dir string, files []File) (string, error) {
	data, err := json.Marshal(Manifest{Files: files})
	if err != nil {
		return "", err
	}
	if err := storage.WriteFileSynced(filepath.Join(dir, manifestName), data); err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	return "sha256:" + hex.EncodeToString(sum[:]), nil
}

// SealedSize is the size in bytes of a sealed file of plain plaintext
// bytes: the magic and salt, then each chunk (one at least) with its tag.
func SealedSize(plain int64) int64 {
	chunks := max((plain+ChunkSize-1)/ChunkSize, 1)
	return int64(len(magic)+saltSize) + plain + chunks*tagSize
}

// sealTo seals what in yields into dst (created, 0600, fsynced) as file
// name, writing the plaintext to clear too unless it is nil.
func sealTo(key *Key, in io.Reader, dst, name string, clear io.Writer) (File, error) {
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return File{}, err
	}
	defer out.Close()
	h := sha256.New()
	w := bufio.NewWriterSize(io.MultiWriter(out, h), ChunkSize+tagSize)
	salt := make([]byte, saltSize)
	if _, err := rand.Read(salt); err != nil {
		return File{}, err
	}
	aead, err := fileAEAD(key, salt)
	if err != nil {
		return File{}, err
	}
	w.WriteString(magic)
	w.Write(salt)
	r := bufio.NewReaderSize(in, ChunkSize)
	buf := make([]byte, ChunkSize)
	sealed := make([]byte, 0, ChunkSize+tagSize)
	var size int64
	for i := uint64(0); ; i++ {
		n, err := io.ReadFull(r, buf)
		if err != nil && err != io.ErrUnexpectedEOF && err != io.EOF {
			return File{}, err
		}
		_, perr := r.Peek(1)
		last := perr != nil
		if last && perr != io.EOF {
			return File{}, perr
		}
		if clear != nil {
			if _, err := clear.Write(buf[:n]); err != nil {
				return File{}, err
			}
		}
		sealed = aead.Seal(sealed[:0], nonce(i, last), buf[:n], []byte(name))
		if _, err := w.Write(sealed); err != nil {
			return File{}, err
		}
		size += int64(n)
		if last {
			break
		}
	}
	if err := w.Flush(); err != nil {
		return File{}, err
	}
	if err := out.Sync(); err != nil {
		return File{}, err
	}
	return File{Name: name, Size: size, SHA256: hex.EncodeToString(h.Sum(nil))}, out.Close()
}

// openFile decrypts the sealed src into dst, checking f's digest and size.
func openFile(key *Key, src, dst string, f File) error {
	in, err := os.Open(src)
	if err != nil {
		return corrupt("%s: %v", f.Name, err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	w := bufio.NewWriterSize(out, ChunkSize)
	if err := openTo(key, in, f, w); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return out.Close()
}

// OpenStream decrypts the sealed file src, listed in its manifest as f
// (ParseManifest's), writing the plaintext to w chunk by chunk as each
// authenticates. A chunk that does not authenticate, or a file whose
// sha256 or size is not f's, fails with ErrConflict ("failed its
// integrity check"); what was written to w by then is authentic but
// incomplete, and the caller discards it. Memory is one chunk.
func OpenStream(key *Key, src string, f File, w io.Writer) error {
	in, err := os.Open(src)
	if err != nil {
		return corrupt("%s: %v", f.Name, err)
	}
	defer in.Close()
	return openTo(key, in, f, w)
}

// openTo decrypts the sealed bytes in yields (file f) to w.
func openTo(key *Key, in io.Reader, f File, w io.Writer) error {
	h := sha256.New()
	r := bufio.NewReaderSize(io.TeeReader(in, h), ChunkSize+tagSize)
	head := make([]byte, len(magic)+saltSize)
	if _, err := io.ReadFull(r, head); err != nil || string(head[:len(magic)]) != magic {
		return corrupt("%s: not a sealed file", f.Name)
	}
	aead, err := fileAEAD(key, head[len(magic):])
	if err != nil {
		return err
	}
	buf := make([]byte, ChunkSize+tagSize)
	plain := make([]byte, 0, ChunkSize)
	var size int64
	for i := uint64(0); ; i++ {
		n, err := io.ReadFull(r, buf)
		if err != nil && err != io.ErrUnexpectedEOF {
			return corrupt("%s: cut off after %d chunks", f.Name, i)
		}
		_, perr := r.Peek(1)
		last := perr != nil
		plain, err = aead.Open(plain[:0], nonce(i, last), buf[:n], []byte(f.Name))
		if err != nil {
			return corrupt("%s: chunk %d does not authenticate (altered, reordered or cut off)", f.Name, i)
		}
		if _, err := w.Write(plain); err != nil {
			return err
		}
		size += int64(len(plain))
		if last {
			break
		}
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != f.SHA256 {
		return corrupt("%s: sha256 %s, recorded %s", f.Name, got, f.SHA256)
	}
	if size != f.Size {
		return corrupt("%s: %d bytes, recorded %d", f.Name, size, f.Size)
	}
	return nil
}
