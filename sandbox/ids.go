package sandbox

import (
	"crypto/rand"
	"encoding/hex"

	"github.com/forkbox/forkbox/node"
)

// newID returns a random sandbox id (node.NewID).
func newID() string { return node.NewID() }

// validID reports whether id has the shape newID makes.
func validID(id string) bool { return node.ValidID(id) }

// newToken returns a random secret of 256 bits as 64 hex digits: a
// session's envd access token.
func newToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand does not fail on Linux
	return hex.EncodeToString(b)
}
