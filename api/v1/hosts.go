package v1

import "time"

// Host is one host of the fleet as GET /v1/hosts lists it (package fleet's
// registry record).
type Host struct {
	// ID is the host's fleet id (serve --node-id; "local" alone).
	ID string `json:"id"`
	// API is the base URL of the host's forkbox API.
	API string `json:"api"`
	// Version is the forkbox version the host runs.
	Version string `json:"version"`
	// Tiers are its isolation drivers ("runc", "gvisor").
	Tiers []string `json:"tiers"`
	// MemoryMB is the memory (MiB) its sessions' limits may add up to.
	MemoryMB int64 `json:"memory_mb"`
	// CPUs is its CPU count.
	CPUs int `json:"cpus"`
	// SessionSlots is the most sessions it runs at once.
	SessionSlots int `json:"session_slots"`
	// Sessions is how many sessions it has now (on a draining host: how
	// many are left).
	Sessions int `json:"sessions"`
	// Pooled is how many warm-pool members it holds ready (0 for a lost
	// host: its members are forgotten).
	Pooled int `json:"pooled"`
	// State is "ready", "draining" or "lost" (no heartbeat for longer
	// than the answering host's --host-lost-after).
	State string `json:"state"`
	// Placeable says whether the answering host would place sessions
	// there: ready and of a compatible version (same major.minor release,
	// or the same build for non-release versions).
	Placeable bool `json:"placeable"`
	// Heartbeat is when its record was last written (RFC 3339).
	Heartbeat time.Time `json:"heartbeat"`
	// Started is when its daemon started.
	Started time.Time `json:"started"`
}

// HostList is the body of GET /v1/hosts.
type HostList struct {
	// Self is the answering host's id.
	Self  string `json:"self"`
	Hosts []Host `json:"hosts"`
}
