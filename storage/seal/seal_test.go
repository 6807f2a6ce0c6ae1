package seal

import (
	"bytes"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// sealed writes files into a new directory, seals it and returns the
// sealed directory, its digest and the key.
func sealed(t *testing.T, files map[string][]byte) (string, string, *Key) {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	os.Mkdir(src, 0o700)
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(src, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	key, err := LoadKey(filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "sealed")
	digest, n, err := SealDir(key, src, dst)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, d := range files {
		total += int64(len(d))
	}
	if n != total {
		t.Fatalf("sealed %d bytes, want %d", n, total)
	}
	return dst, digest, key
}

func random(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func TestRoundTrip(t *testing.T) {
	files := map[string][]byte{"empty": nil, "small": []byte("hello"), "exact": random(ChunkSize),
		"big": random(3*ChunkSize + 17)}
	dst, digest, key := sealed(t, files)
	for name, data := range files {
		b, _ := os.ReadFile(filepath.Join(dst, name))
		if len(data) > 16 && bytes.Contains(b, data[:16]) {
			t.Fatalf("%s: plaintext found in the sealed file", name)
		}
	}
	out := filepath.Join(t.TempDir(), "out")
	if err := OpenDir(key, dst, digest, out); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		got, err := os.ReadFile(filepath.Join(out, name))
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("%s: round trip differs (%d bytes, %v)", name, len(got), err)
		}
	}
}

// TestTamper: every kind of damage is refused with ErrConflict and leaves
// no output directory.
func TestTamper(t *testing.T) {
	data := random(2*ChunkSize + 100)
	cases := map[string]func(t *testing.T, dst string, key *Key) (*Key, string){
		"flipped byte": func(t *testing.T, dst string, key *Key) (*Key, string) {
			p := filepath.Join(dst, "pages")
			b, _ := os.ReadFile(p)
			b[len(b)/2] ^= 1
			os.WriteFile(p, b, 0o600)
			return key, ""
		},
		"truncated at a chunk boundary": func(t *testing.T, dst string, key *Key) (*Key, string) {
			p := filepath.Join(dst, "pages")
			os.Truncate(p, int64(len(magic)+saltSize+2*(ChunkSize+tagSize)))
			return key, ""
		},
		"truncated": func(t *testing.T, dst string, key *Key) (*Key, string) {
			os.Truncate(filepath.Join(dst, "pages"), 1000)
			return key, ""
		},
		"chunks swapped": func(t *testing.T, dst string, key *Key) (*Key, string) {
			p := filepath.Join(dst, "pages")
			b, _ := os.ReadFile(p)
			h, c := len(magic)+saltSize, ChunkSize+tagSize
			first := append([]byte(nil), b[h:h+c]...)
			copy(b[h:h+c], b[h+c:h+2*c])
			copy(b[h+c:h+2*c], first)
			os.WriteFile(p, b, 0o600)
			return key, ""
		},
		"file missing": func(t *testing.T, dst string, key *Key) (*Key, string) {
			os.Remove(filepath.Join(dst, "pages"))
			return key, ""
		},
		"manifest edited": func(t *testing.T, dst string, key *Key) (*Key, string) {
			p := filepath.Join(dst, manifestName)
			b, _ := os.ReadFile(p)
			os.WriteFile(p, bytes.Replace(b, []byte(`"size":`), []byte(`"size": `), 1), 0o600)
			return key, ""
		},
		"wrong key": func(t *testing.T, dst string, key *Key) (*Key, string) {
			other := *key
			other[0] ^= 1
			return &other, ""
		},
		"wrong digest": func(t *testing.T, dst string, key *Key) (*Key, string) {
			return key, "sha256:00"
		},
	}
	for name, damage := range cases {
		t.Run(name, func(t *testing.T) {
			dst, digest, key := sealed(t, map[string][]byte{"pages": data, "state": []byte("x")})
			k, d := damage(t, dst, key)
			if d != "" {
				digest = d
			}
			out := filepath.Join(t.TempDir(), "out")
			err := OpenDir(k, dst, digest, out)
			if !errors.Is(err, errdefs.ErrConflict) {
				t.Fatalf("OpenDir = %v, want an integrity failure", err)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Fatalf("output left behind after a failed open: %v", err)
			}
		})
	}
}

func TestKeyFromEnv(t *testing.T) {
	t.Setenv(KeyEnv, "zz")
	if _, err := LoadKey(filepath.Join(t.TempDir(), "k")); err == nil {
		t.Fatal("a malformed key was accepted")
	}
	t.Setenv(KeyEnv, "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff")
	k, err := LoadKey(filepath.Join(t.TempDir(), "k"))
	if err != nil || k[1] != 0x11 {
		t.Fatalf("key from env: %v", err)
	}
}

// TestSealDirCopy: the copy holds each file's plaintext exactly (0600 in
// a 0700 directory) and the sealed directory opens as SealDir's does.
func TestSealDirCopy(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "plain")
	os.Mkdir(src, 0o700)
	files := map[string][]byte{"small": []byte("hello"), "big": random(2*ChunkSize + 5), "empty": nil}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(src, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	key, err := LoadKey(filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	dst, cp := filepath.Join(dir, "sealed"), filepath.Join(dir, "copy")
	digest, _, err := SealDirCopy(key, src, dst, cp)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(cp); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("copy directory: %v %v", st, err)
	}
	out := filepath.Join(dir, "out")
	if err := OpenDir(key, dst, digest, out); err != nil {
		t.Fatal(err)
	}
	for name, data := range files {
		c, err := os.ReadFile(filepath.Join(cp, name))
		if err != nil || !bytes.Equal(c, data) {
			t.Fatalf("%s: copy differs (%v)", name, err)
		}
		if st, _ := os.Stat(filepath.Join(cp, name)); st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: copy mode %v", name, st.Mode())
		}
		o, _ := os.ReadFile(filepath.Join(out, name))
		if !bytes.Equal(o, data) {
			t.Fatalf("%s: opened file differs", name)
		}
	}
	// A failure leaves neither directory.
	if _, _, err := SealDirCopy(key, src, filepath.Join(dir, "sealed2"), cp); err == nil {
		t.Fatal("a copy directory that exists was taken")
	}
	if _, err := os.Stat(filepath.Join(dir, "sealed2")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("sealed directory after a failure: %v", err)
	}
}

// TestSealedSize: SealedSize is the size SealStream's files have.
func TestSealedSize(t *testing.T) {
	var k Key
	for _, n := range []int{0, 1, ChunkSize - 1, ChunkSize, ChunkSize + 1, 3 * ChunkSize} {
		dst := filepath.Join(t.TempDir(), "f")
		f, err := SealStream(&k, bytes.NewReader(make([]byte, n)), dst, "f")
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(dst)
		if err != nil {
			t.Fatal(err)
		}
		if got := SealedSize(f.Size); got != fi.Size() {
			t.Errorf("%d bytes sealed: SealedSize %d, file %d", n, got, fi.Size())
		}
	}
}
