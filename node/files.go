package node

import "time"

// Entry describes a file, directory or symlink inside a sandbox.
type Entry struct {
	Name string
	// Path is absolute inside the sandbox.
	Path string
	// Type is "file", "dir" or "symlink".
	Type string
	// Size in bytes.
	Size int64
	// Mode holds the permission bits (0o755).
	Mode uint32
	// Permissions is the ls-style mode string ("-rw-r--r--").
	Permissions   string
	Owner         string
	Group         string
	ModifiedAt    time.Time
	SymlinkTarget string
}
