// Package bindmount holds the one type the storage and runtime layers
// share: a host path bind-mounted into a sandbox. It sits below both, so
// storage can record a template's host mounts (template.json) and a
// runtime driver can mount them without either importing the other.
package bindmount

// Mount is a host path bind-mounted into the sandbox. Its JSON form is
// stored in template.json, so the field names are part of the data
// directory's format.
type Mount struct {
	// Source is an absolute host path.
	Source string `json:"source"`
	// Target is an absolute path inside the sandbox.
	Target string `json:"target"`
	// ReadOnly mounts it read-only (and nosuid, nodev).
	ReadOnly bool `json:"read_only"`
}
