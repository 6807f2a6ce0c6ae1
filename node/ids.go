package node

import "crypto/rand"

// idAlphabet and idLength give session and snapshot ids the shape E2B
// uses: 20 characters of [a-z0-9] (about 103 bits), safe as a hostname, a
// runc id, a cgroup name and a DNS label.
const (
	idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	idLength   = 20
)

// MaxSnapshotName is the longest snapshot name, in bytes.
const MaxSnapshotName = 128

// NewID returns a random session or snapshot id.
func NewID() string {
	out := make([]byte, 0, idLength)
	buf := make([]byte, 32)
	for len(out) < idLength {
		_, _ = rand.Read(buf) // crypto/rand does not fail on Linux
		for _, c := range buf {
			// 252 = 7*36: dropping bytes above it keeps every character equally likely.
			if c < 252 && len(out) < idLength {
				out = append(out, idAlphabet[int(c)%len(idAlphabet)])
			}
		}
	}
	return string(out)
}

// ValidID reports whether id has the shape NewID makes.
func ValidID(id string) bool {
	if len(id) != idLength {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// ValidSnapshotName reports whether name can name a snapshot: 1 to
// MaxSnapshotName bytes of printable ASCII without spaces, and not shaped
// like an id (so that a reference is never ambiguous). E2B names look like
// "team/name:tag".
func ValidSnapshotName(name string) bool {
	if name == "" || len(name) > MaxSnapshotName || ValidID(name) {
		return false
	}
	for i := 0; i < len(name); i++ {
		if name[i] <= ' ' || name[i] > '~' {
			return false
		}
	}
	return true
}
