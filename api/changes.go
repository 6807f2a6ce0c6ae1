package api

import (
	"encoding/json"
	"net/http"
	"time"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/node"
)

// diffOptions reads ?base= and ?patch= of a diff request.
func diffOptions(r *http.Request) (node.DiffOptions, error) {
	patch, err := boolParam(r, "patch")
	if err != nil {
		return node.DiffOptions{}, err
	}
	return node.DiffOptions{Base: r.URL.Query().Get("base"), Patch: patch}, nil
}

// handleSessionDiff: GET /v1/sessions/{id}/diff[?base=SNAP][&patch=true]
// → 200 with what the session changed relative to the snapshot (default:
// the one it started from).
func (h *snapshotAPI) handleSessionDiff(w http.ResponseWriter, r *http.Request) {
	opts, err := diffOptions(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	d, err := h.mgr.SessionDiff(r.Context(), r.PathValue("id"), opts)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, diffView(d))
}

// handleSnapshotDiff: GET /v1/snapshots/{id}/diff[?base=SNAP][&patch=true]
// → 200 with what the snapshot holds relative to base (default: its
// parent).
func (h *snapshotAPI) handleSnapshotDiff(w http.ResponseWriter, r *http.Request) {
	opts, err := diffOptions(r)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	d, err := h.mgr.SnapshotDiff(r.Context(), r.PathValue("id"), opts)
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, diffView(d))
}

// handleMerge: POST /v1/sessions/{id}/merge {from, paths?, on_conflict?}
// → 200 with what was applied; 409 merge-conflict listing every path.
func (h *snapshotAPI) handleMerge(w http.ResponseWriter, r *http.Request) {
	var req v1.MergeRequest
	if err := decodeJSON(r, &req, maxJSONBody, false); err != nil {
		h.writeError(w, r, err)
		return
	}
	res, err := h.mgr.Merge(r.Context(), r.PathValue("id"), node.MergeSpec{From: req.From, Paths: req.Paths, OnConflict: req.OnConflict})
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	out := v1.MergeResult{Base: res.Base, Applied: fileChanges(res.Applied), Merged: nonNil(res.Merged), Conflicts: nonNil(res.Conflicts)}
	writeJSON(w, http.StatusOK, out)
}

// handleForkRun serves POST /v1/snapshots/{id}/fork with "run": the
// children's results as NDJSON (application/x-ndjson), one ForkEvent
// line per child as it ends, then a "done" line. Errors before the fork
// are problem JSON.
func (h *snapshotAPI) handleForkRun(w http.ResponseWriter, r *http.Request, req v1.ForkRequest) {
	run := node.ForkRunSpec{Cmd: req.Run.Cmd, Timeout: time.Duration(req.Run.TimeoutS) * time.Second, Keep: req.Keep}
	if req.Run.TimeoutS < 0 {
		run.Timeout = -1
	}
	if req.Score != nil {
		run.ScoreRegex, run.ScoreFile = req.Score.StdoutRegex, req.Score.File
	}
	started := false
	enc := json.NewEncoder(w)
	flusher, _ := w.(http.Flusher)
	emit := func(c node.ForkChildResult) {
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
		}
		_ = enc.Encode(v1.ForkEvent{Type: "child", Index: c.Index, SessionID: c.SessionID, ExitCode: c.ExitCode,
			DurationMS: c.Duration.Milliseconds(), StdoutTail: c.StdoutTail, StderrTail: c.StderrTail, Score: c.Score,
			Error: c.Error, TimedOut: c.TimedOut})
		if flusher != nil {
			flusher.Flush()
		}
	}
	sum, err := h.mgr.ForkRun(r.Context(), r.PathValue("id"), req.Count, createSpec(req.CreateRequest), run, emit)
	if err != nil {
		if !started {
			h.writeError(w, r, err)
		}
		return
	}
	if !started {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
	}
	best := sum.Best
	_ = enc.Encode(v1.ForkEvent{Type: "done", Snapshot: sum.Snapshot, Kept: nonNil(sum.Kept), Destroyed: nonNil(sum.Destroyed), Best: &best})
	ids := append(append([]string{}, sum.Kept...), sum.Destroyed...)
	noteIDs(r, ids)
}

func diffView(d *node.Diff) v1.Diff {
	return v1.Diff{Base: d.Base, Changes: fileChanges(d.Changes), Stats: v1.DiffStats{Entries: d.Entries, ComparedFiles: d.Compared,
		ElapsedMS: float64(d.Elapsed.Microseconds()) / 1000}}
}

func fileChanges(cs []node.FileChange) []v1.FileChange {
	out := make([]v1.FileChange, 0, len(cs))
	for _, c := range cs {
		out = append(out, v1.FileChange{Path: c.Path, Op: c.Op, Kind: c.Kind, Size: c.Size, Mode: c.Mode, SymlinkTarget: c.Target,
			OldKind: c.OldKind, OldSize: c.OldSize, OldMode: c.OldMode, Patch: c.Patch, Binary: c.Binary, TooLarge: c.TooLarge,
			PatchOmitted: c.PatchOmitted})
	}
	return out
}

// nonNil is s, or an empty slice for nil (JSON [] rather than null).
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
