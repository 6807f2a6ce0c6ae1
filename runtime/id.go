package runtime

import "strings"

// MaxIDLen is the longest sandbox id, in bytes: a hostname label
// (RFC 1123) and a cgroup and runtime id as well.
const MaxIDLen = 63

// ValidID reports whether id is a valid sandbox id (Config.ID): 1 to
// MaxIDLen characters of [a-z0-9], so that it is safe unquoted as a runc
// or runsc id, a cgroup directory name, a path component and a hostname.
func ValidID(id string) bool {
	if id == "" || len(id) > MaxIDLen {
		return false
	}
	return strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789") == ""
}
