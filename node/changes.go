package node

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/forkbox/forkbox/errdefs"
)

// Changes compares sessions and snapshots, merges one session's changes
// into another, and forks a snapshot to run a command in every child.
type Changes interface {
	// SessionDiff lists what live session id changed relative to
	// snapshot opts.Base ("" : the snapshot it started from; a session
	// made from a template has none, ErrInvalidArgument naming "base").
	SessionDiff(ctx context.Context, id string, opts DiffOptions) (*Diff, error)
	// SnapshotDiff lists what snapshot ref holds relative to snapshot
	// opts.Base ("": its parent; ErrInvalidArgument when it has none).
	SnapshotDiff(ctx context.Context, ref string, opts DiffOptions) (*Diff, error)
	// Merge applies the changes spec.From (a session or a snapshot) made
	// relative to the snapshot it shares with session id into session id
	// (a three-way merge per file). Conflicts with OnConflict "fail" are
	// a *ConflictError (ErrConflict) and nothing changes; no common
	// snapshot is ErrInvalidArgument naming "from"; another tenant's
	// session ErrNotFound. All or nothing, also across a daemon crash.
	Merge(ctx context.Context, id string, spec MergeSpec) (*MergeResult, error)
	// ForkRun forks count children from snapshot ref (spec as Fork),
	// runs run.Cmd in each at once, calls emit with each child's result
	// as it ends (from one goroutine at a time), then destroys the
	// children keep does not keep, and returns the kept ones' ids.
	ForkRun(ctx context.Context, ref string, count int, spec CreateSpec, run ForkRunSpec, emit func(ForkChildResult)) (*ForkRunSummary, error)
}

// DiffOptions are the optional settings of a diff.
type DiffOptions struct {
	// Base is the snapshot (id or name) to compare with; "" for the
	// default (see Changes).
	Base string
	// Patch adds unified diffs of changed text files, within MaxPatchBytes.
	Patch bool
}

// MaxPatchBytes bounds the unified diff text of one diff answer, in
// bytes; files past it are listed with PatchOmitted.
const MaxPatchBytes = 4 << 20

// FileChange is one path a diff or merge found changed.
type FileChange struct {
	// Path is absolute inside the sandbox.
	Path string
	// Op is "added", "modified" or "deleted".
	Op string
	// Kind is "file", "dir", "symlink" or "other" (device, FIFO,
	// socket): the new entry's, or the old one's for a deletion.
	Kind string
	// Size in bytes and Mode (permission bits with setuid, setgid,
	// sticky) of the new entry (of the old one for a deletion).
	Size int64
	Mode uint32
	// Target is a symlink's target (never followed).
	Target string
	// OldKind, OldSize and OldMode describe the old entry of a
	// modification.
	OldKind string
	OldSize int64
	OldMode uint32
	// Patch is the unified diff of a text file (with DiffOptions.Patch).
	Patch string
	// Binary: the file is binary (no patch shown); TooLarge: larger than
	// the patch limit per file; PatchOmitted: past MaxPatchBytes.
	Binary, TooLarge, PatchOmitted bool
}

// Diff is the answer of a diff.
type Diff struct {
	// Base is the snapshot compared with (its id).
	Base    string
	Changes []FileChange
	// Entries is how many entries the comparison stat'ed (both trees);
	// Compared how many files' contents it read to tell a touch from an
	// edit; Elapsed what it took.
	Entries, Compared int64
	Elapsed           time.Duration
}

// Conflict policies of MergeSpec.OnConflict.
const (
	OnConflictFail   = "fail"
	OnConflictOurs   = "ours"
	OnConflictTheirs = "theirs"
)

// MergeSpec is what Changes.Merge takes.
type MergeSpec struct {
	// From is a session id or a snapshot id or name.
	From string
	// Paths, when not empty, limits the merge to these paths (absolute
	// inside the sandbox) and what is under them.
	Paths []string
	// OnConflict is "fail" ("" is the same), "ours" (keep the target's
	// version) or "theirs" (take From's version whole).
	OnConflict string
}

// MergeResult is the answer of a merge.
type MergeResult struct {
	// Base is the common snapshot the merge was relative to.
	Base string
	// Applied are the paths the merge changed in the session, with what
	// they now are (Op "deleted" for a removal).
	Applied []FileChange
	// Merged are the text files merged line by line (both sides changed).
	Merged []string
	// Conflicts are the conflicting paths resolved by OnConflict.
	Conflicts []string
}

// ProblemMergeConflict is the problem type of a *ConflictError (409).
const ProblemMergeConflict = "merge-conflict"

// ConflictError is a merge refused for conflicts: Paths lists every
// conflicting path (absolute inside the sandbox). Its class is
// errdefs.ErrConflict.
type ConflictError struct {
	Paths []string
}

// Error names the paths (the first 20).
func (e *ConflictError) Error() string {
	shown := e.Paths
	if len(shown) > 20 {
		shown = shown[:20]
	}
	more := ""
	if len(e.Paths) > len(shown) {
		more = fmt.Sprintf(" and %d more", len(e.Paths)-len(shown))
	}
	return fmt.Sprintf("the merge conflicts in %d path(s): %s%s; nothing was changed (retry with on_conflict ours or theirs)",
		len(e.Paths), strings.Join(shown, ", "), more)
}

// Unwrap makes errors.Is(err, errdefs.ErrConflict) true.
func (e *ConflictError) Unwrap() error { return errdefs.ErrConflict }

// Keep policies of ForkRunSpec.Keep.
const (
	KeepAll  = "all"
	KeepBest = "best"
	KeepNone = "none"
)

// ForkRunSpec is the command a fork runs in every child.
type ForkRunSpec struct {
	// Cmd runs with /bin/sh -c as the session's default user.
	Cmd string
	// Timeout bounds each child's run (0: DefaultForkRunTimeout); the
	// command is killed past it.
	Timeout time.Duration
	// Keep is "all" ("" is the same), "best" (the child with the highest
	// score, ties to the lowest index; children without a score lose) or
	// "none".
	Keep string
	// ScoreRegex, when set, scores a child by the first number captured
	// (group 1, or the whole match) in the last match in its stdout.
	ScoreRegex string
	// ScoreFile, when set, scores a child by the number its file holds
	// (absolute path inside the sandbox; read after the command ends).
	ScoreFile string
}

// DefaultForkRunTimeout bounds a fork's command when its spec sets none.
const DefaultForkRunTimeout = 10 * time.Minute

// ForkTailBytes is how much of each stream's end a ForkChildResult keeps.
const ForkTailBytes = 4096

// ForkChildResult is one child's run.
type ForkChildResult struct {
	// Index is the child's position (0..count-1); SessionID its id.
	Index     int
	SessionID string
	// ExitCode is the command's (-1 when it did not end: Error says why).
	ExitCode int
	Duration time.Duration
	// StdoutTail and StderrTail are the last ForkTailBytes of each.
	StdoutTail, StderrTail string
	// Score is set when the child was scored.
	Score *float64
	// Error says why the command did not run or end ("" when it did);
	// TimedOut when it was killed at the timeout.
	Error    string
	TimedOut bool
}

// ForkRunSummary is what a ForkRun ends with.
type ForkRunSummary struct {
	// Snapshot is the snapshot forked.
	Snapshot string
	// Kept are the ids of the children kept (running); Destroyed the others.
	Kept, Destroyed []string
	// Best is the index of the best-scoring child (-1 when none scored).
	Best int
}
