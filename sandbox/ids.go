package sandbox

import (
	"crypto/rand"
	"encoding/hex"
)

// idAlphabet and idLength give sandbox ids the shape E2B uses: 20
// characters of [a-z0-9] (about 103 bits), safe as a hostname, a runc id, a
// cgroup name and a DNS label.
const (
	idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	idLength   = 20
)

// newID returns a random sandbox id.
func newID() string {
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

// validID reports whether id has the shape newID makes.
func validID(id string) bool {
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

// newToken returns a random secret of 256 bits as 64 hex digits: a
// session's envd access token.
func newToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand does not fail on Linux
	return hex.EncodeToString(b)
}
