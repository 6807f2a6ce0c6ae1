package btrfs

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// layerMeta is what the driver records about a layer, as
// Dir/layers/<id>.json.
type layerMeta struct {
	// Snapshot is the snapshot the layer was prepared from ("" for a
	// template).
	Snapshot string `json:"snapshot,omitempty"`
	// Template is the template at the bottom of the layer's chain.
	Template string `json:"template"`
	// Ancestors are the snapshots the layer is built on, nearest first
	// (Snapshot, then its parent, ...).
	Ancestors []string `json:"ancestors,omitempty"`
	// QuotaBytes is the exclusive-bytes limit set on the layer (0: none).
	QuotaBytes int64 `json:"quota_bytes,omitempty"`
	// BaseReferenced is the referenced bytes of the subvolume the layer was
	// made from; what the layer references beyond it is its size (Usage,
	// and a snapshot's SizeBytes).
	BaseReferenced int64     `json:"base_referenced_bytes"`
	CreatedAt      time.Time `json:"created_at"`
}

// snapMeta is what the driver records about a snapshot, as
// Dir/snapshots/<id>.json.
type snapMeta struct {
	ID string `json:"id"`
	// Parent is the snapshot the layer was prepared from ("" for a template).
	Parent string `json:"parent,omitempty"`
	// Template is the template at the bottom of the chain.
	Template string `json:"template"`
	// Ancestors are Parent, its parent, ... so Verify can follow the chain
	// past snapshots that were removed.
	Ancestors []string `json:"ancestors,omitempty"`
	// SizeBytes is what the layer had written beyond its parent when the
	// snapshot was taken, in bytes.
	SizeBytes int64 `json:"size_bytes"`
	// Digest is storage.ManifestDigest of the snapshot subvolume.
	Digest string `json:"digest"`
	// Entries is how many entries the digest covers (0 in metadata
	// written before it was recorded).
	Entries int64 `json:"entries,omitempty"`
	// Verified is the subvolume's stamp when a walk last found Digest
	// (stamp.go); Verify trusts Digest without walking while the stamp
	// holds. Absent in metadata written before it existed: the first
	// Verify walks and records it.
	Verified  *stamp    `json:"verified,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// templateMeta is what the driver records about a template, as
// Dir/templates/<name>.json.
type templateMeta struct {
	Version   string    `json:"version"`
	Source    string    `json:"source"`
	CreatedAt time.Time `json:"created_at"`
}

// removeFile deletes path; a missing file is not an error.
func removeFile(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("btrfs: %w", err)
	}
	return nil
}

// listIDs returns the names of the subdirectories of dir that are not the
// driver's temporary entries (leading '.'); with needMeta, only those with
// a <name>.json beside them. A missing dir lists nothing.
func listIDs(dir string, needMeta bool) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("btrfs: list %s: %w", dir, err)
	}
	ids := []string{}
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if needMeta {
			if _, err := os.Stat(filepath.Join(dir, e.Name()+".json")); err != nil {
				continue
			}
		}
		ids = append(ids, e.Name())
	}
	return ids, nil
}
