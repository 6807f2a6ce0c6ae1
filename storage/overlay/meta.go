package overlay

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/forkbox/forkbox/storage"
)

// templateMeta is what the driver records about a template, as
// Dir/templates/<name>.json.
type templateMeta struct {
	// Rootfs is the template's root filesystem directory, used in place as
	// the lowest overlay layer.
	Rootfs string `json:"rootfs"`
	// Version is the caller's opaque content version.
	Version   string    `json:"version"`
	CreatedAt time.Time `json:"created_at"`
}

// layerMeta is what the driver records about a sandbox layer, as
// Dir/layers/<id>/meta.json. It is written before anything that needs
// undoing (a project id, a disk image), so Remove can always undo it.
type layerMeta struct {
	// Snapshot is the snapshot the layer was prepared from ("" for a
	// template).
	Snapshot string `json:"snapshot,omitempty"`
	// Template is the template at the bottom of the chain; Rootfs is its
	// root filesystem directory as it was when the layer was prepared.
	Template string `json:"template"`
	Rootfs   string `json:"rootfs"`
	// Chain is the snapshots under the layer, nearest first (Snapshot,
	// its parent, ...).
	Chain []string `json:"chain,omitempty"`
	// ProjectID is the XFS project id of the layer's upper and work
	// directories (0: none, quotas unavailable).
	ProjectID uint32 `json:"project_id,omitempty"`
	// Disk is true when the layer's upper and work directories live on a
	// loop-mounted image of their own (the disk limit without project
	// quotas).
	Disk       bool      `json:"disk,omitempty"`
	QuotaBytes int64     `json:"quota_bytes,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
}

// snapMeta is what the driver records about a snapshot, as
// Dir/snapshots/<id>/meta.json.
type snapMeta struct {
	ID string `json:"id"`
	// Parent is the snapshot the layer was prepared from ("" for a
	// template).
	Parent string `json:"parent,omitempty"`
	// Template is the template at the bottom of the chain; Rootfs is its
	// root filesystem directory, the lowest layer of every restore.
	Template string `json:"template"`
	Rootfs   string `json:"rootfs"`
	// Chain is the snapshots this one is built on, nearest first (Parent,
	// its parent, ...).
	Chain []string `json:"chain,omitempty"`
	// SizeBytes is the allocated bytes of the copied upper directory.
	SizeBytes int64 `json:"size_bytes"`
	// Digest is storage.ManifestDigest of the snapshot's layer directory.
	Digest    string    `json:"digest"`
	CreatedAt time.Time `json:"created_at"`
}

// projectsMeta is the persistent project id allocator, Dir/projects.json.
type projectsMeta struct {
	// Next is the next project id to hand out; ids are never reused.
	Next uint32 `json:"next"`
}

// listIDs returns the sorted names in dir that are valid ids, keeping
// only names ending in suffix (which is cut off) when suffix is not "".
// A missing dir lists nothing.
func listIDs(dir, suffix string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	ids := []string{}
	for _, e := range ents {
		name, ok := strings.CutSuffix(e.Name(), suffix)
		if !ok || storage.ValidID("", name) != nil {
			continue
		}
		ids = append(ids, name)
	}
	sort.Strings(ids)
	return ids, nil
}
