// Package storage owns forkbox's root filesystems on disk: templates (the
// built-in base template and imported OCI images, both kept as read-only
// root filesystems), each sandbox's writable layer and its snapshots,
// through a Driver (btrfs or overlay). The daemon hands each driver the
// directory it owns; where that lies in the data directory is package
// datadir's.
package storage
