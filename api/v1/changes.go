package v1

// FileChange is one changed path of a diff or merge (GET
// /v1/sessions/{id}/diff, GET /v1/snapshots/{id}/diff, POST
// /v1/sessions/{id}/merge).
type FileChange struct {
	// Path is absolute inside the sandbox.
	Path string `json:"path"`
	// Op is "added", "modified" or "deleted".
	Op string `json:"op"`
	// Kind is "file", "dir", "symlink" or "other" (the new entry's; the
	// old one's for a deletion).
	Kind string `json:"kind"`
	// Size in bytes; Mode the permission bits (with setuid, setgid, sticky).
	Size int64  `json:"size"`
	Mode uint32 `json:"mode"`
	// SymlinkTarget is a symlink's target (never followed).
	SymlinkTarget string `json:"symlink_target,omitempty"`
	// OldKind, OldSize, OldMode describe the old entry of a modification.
	OldKind string `json:"old_kind,omitempty"`
	OldSize int64  `json:"old_size,omitempty"`
	OldMode uint32 `json:"old_mode,omitempty"`
	// Patch is a text file's unified diff (with ?patch=true).
	Patch string `json:"patch,omitempty"`
	// Binary: no patch, the file is binary; TooLarge: over 1 MiB;
	// PatchOmitted: the answer's 4 MiB of patches were used up.
	Binary       bool `json:"binary,omitempty"`
	TooLarge     bool `json:"too_large,omitempty"`
	PatchOmitted bool `json:"patch_omitted,omitempty"`
}

// Diff is what changed relative to snapshot Base.
type Diff struct {
	Base    string       `json:"base"`
	Changes []FileChange `json:"changes"`
	Stats   DiffStats    `json:"stats"`
}

// DiffStats is what a diff cost.
type DiffStats struct {
	// Entries is the entries stat'ed in both trees; ComparedFiles the
	// files whose contents were read (their times alone differed).
	Entries       int64   `json:"entries"`
	ComparedFiles int64   `json:"compared_files"`
	ElapsedMS     float64 `json:"elapsed_ms"`
}

// MergeRequest is POST /v1/sessions/{id}/merge's body.
type MergeRequest struct {
	// From is a session id or a snapshot id or name.
	From string `json:"from"`
	// Paths limits the merge to these paths and what is under them.
	Paths []string `json:"paths,omitempty"`
	// OnConflict is "fail" (default), "ours" or "theirs".
	OnConflict string `json:"on_conflict,omitempty"`
}

// MergeResult is a merge's answer.
type MergeResult struct {
	// Base is the common snapshot.
	Base string `json:"base"`
	// Applied are the paths changed in the session.
	Applied []FileChange `json:"applied"`
	// Merged are text files merged line by line.
	Merged []string `json:"merged"`
	// Conflicts are conflicting paths resolved by on_conflict.
	Conflicts []string `json:"conflicts"`
}

// ForkRun is the command POST /v1/snapshots/{id}/fork runs in every child.
type ForkRun struct {
	// Cmd runs with /bin/sh -c as the session's default user.
	Cmd string `json:"cmd"`
	// TimeoutS bounds each child's run (0: 600).
	TimeoutS int64 `json:"timeout_s,omitempty"`
}

// ForkScore scores a fork-and-run child: by the last number StdoutRegex
// matches in its stdout (group 1 if any), or the number in File.
type ForkScore struct {
	StdoutRegex string `json:"stdout_regex,omitempty"`
	File        string `json:"file,omitempty"`
}

// ForkEvent is one line of a fork-and-run's NDJSON answer: Type "child"
// for a child's result (as each ends), then one "done" line.
type ForkEvent struct {
	Type string `json:"type"`
	// child
	Index      int      `json:"index"`
	SessionID  string   `json:"session_id,omitempty"`
	ExitCode   int      `json:"exit_code"`
	DurationMS int64    `json:"duration_ms"`
	StdoutTail string   `json:"stdout_tail,omitempty"`
	StderrTail string   `json:"stderr_tail,omitempty"`
	Score      *float64 `json:"score,omitempty"`
	Error      string   `json:"error,omitempty"`
	TimedOut   bool     `json:"timed_out,omitempty"`
	// done
	Snapshot  string   `json:"snapshot,omitempty"`
	Kept      []string `json:"kept,omitempty"`
	Destroyed []string `json:"destroyed,omitempty"`
	// Best is the best-scoring child's index (-1: none scored).
	Best *int `json:"best,omitempty"`
}
