package changes

import (
	"context"
	"slices"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

// MaxMergeTextBytes is the largest text file merged by lines, in bytes
// (larger files are merged whole, as binary files are).
const MaxMergeTextBytes = 4 << 20

// Actions of an Op.
const (
	ActWrite   = "write"   // make Path a regular file holding Data (or Staged)
	ActSymlink = "symlink" // make Path a symlink to Target
	ActMkdir   = "mkdir"   // make Path a directory (or set its attributes)
	ActDelete  = "delete"  // remove Path (a directory once empty)
)

// Op is one step of a merge: make Path (relative to the root) what it
// says, with Mode and owner (host ids).
type Op struct {
	Path   string `json:"path"`
	Action string `json:"action"`
	Target string `json:"target,omitempty"`
	Mode   uint32 `json:"mode"`
	UID    uint32 `json:"uid"`
	GID    uint32 `json:"gid"`
	// Data is a merged text's content (staged by Apply); when nil a write
	// copies Path of the theirs tree.
	Data []byte `json:"-"`
	// Merged marks a write of a text merged by lines.
	Merged bool `json:"merged,omitempty"`
	// Conflict marks an op resolving a conflict (by "theirs").
	Conflict bool `json:"conflict,omitempty"`
	// Staged and undo state: see Apply.
	Staged string `json:"staged,omitempty"`
	Had    *Entry `json:"had,omitempty"`
	Backup string `json:"backup,omitempty"`
}

// Plan is what a three-way merge computed: the ops that bring theirs'
// changes into ours, and the conflicting paths (resolved or not).
type Plan struct {
	Ops       []Op
	Conflicts []string
}

// Resolutions of PlanMerge.
const (
	ResolveFail   = "fail"
	ResolveOurs   = "ours"
	ResolveTheirs = "theirs"
)

// PlanMerge computes the three-way merge that brings into ours what
// theirs changed since base (trees opened read-only; nothing is written).
// Per path: a change only theirs made is taken; the same change on both
// sides is nothing to do; text files both changed are merged by lines
// (Merge3); anything else both changed (binary files, a modification
// against a deletion, kinds that differ, a file added where the other
// side removed its directory) is a conflict, which resolve "ours" leaves
// as ours has it, "theirs" replaces by theirs' entry whole, and "fail"
// only lists. only, when not empty, limits the merge to those paths
// (relative) and what is under them. A special file (device, FIFO,
// socket) that theirs made is ErrInvalidArgument.
func PlanMerge(ctx context.Context, base, ours, theirs *Tree, only []string, resolve string) (*Plan, error) {
	od, err := Diff(ctx, base, ours, Options{})
	if err != nil {
		return nil, err
	}
	td, err := Diff(ctx, base, theirs, Options{})
	if err != nil {
		return nil, err
	}
	o := make(map[string]Change, len(od.Changes))
	for _, c := range od.Changes {
		o[c.Path] = c
	}
	p := &planner{base: base, ours: ours, theirs: theirs, o: o, ops: map[string]Op{}, resolve: resolve}
	for _, c := range td.Changes {
		if !selected(c, only) {
			continue
		}
		if err := p.change(c); err != nil {
			return nil, err
		}
	}
	plan := &Plan{Conflicts: p.conflicts}
	for _, op := range p.ops {
		plan.Ops = append(plan.Ops, op)
	}
	SortOps(plan.Ops)
	return plan, nil
}

// SortOps orders ops as Apply runs them: deletions first, deepest paths
// first, then the rest in path order (a directory before its contents).
func SortOps(ops []Op) {
	slices.SortFunc(ops, func(a, b Op) int {
		ad, bd := a.Action == ActDelete, b.Action == ActDelete
		switch {
		case ad && !bd:
			return -1
		case bd && !ad:
			return 1
		case ad:
			return strings.Compare(b.Path, a.Path)
		}
		return strings.Compare(a.Path, b.Path)
	})
}

// selected reports whether c is within only (or an ancestor directory of
// one of them that theirs made, which the path needs).
func selected(c Change, only []string) bool {
	if len(only) == 0 {
		return true
	}
	for _, p := range only {
		if p == "" || c.Path == p || strings.HasPrefix(c.Path, p+"/") {
			return true
		}
		if strings.HasPrefix(p, c.Path+"/") && c.New != nil && c.New.Kind == KindDir {
			return true
		}
	}
	return false
}

// planner is the state of one PlanMerge.
type planner struct {
	base, ours, theirs *Tree
	o                  map[string]Change
	ops                map[string]Op
	conflicts          []string
	resolve            string
}

// take records the op that makes p theirs' entry e (nil: deleted).
func (p *planner) take(path string, e *Entry, conflict bool) error {
	if e == nil {
		p.ops[path] = Op{Path: path, Action: ActDelete, Conflict: conflict}
		return nil
	}
	op := Op{Path: path, Mode: e.Mode, UID: e.UID, GID: e.GID, Conflict: conflict}
	switch e.Kind {
	case KindFile:
		op.Action = ActWrite
	case KindDir:
		op.Action = ActMkdir
	case KindSymlink:
		op.Action, op.Target = ActSymlink, e.Target
	default:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "%q is a special file (device, FIFO or socket), which a merge does not copy", "/"+path)
	}
	p.ops[path] = op
	return nil
}

// conflict records a conflict at path, resolved as p.resolve says.
func (p *planner) conflict(c Change) error {
	p.conflicts = append(p.conflicts, "/"+c.Path)
	if p.resolve != ResolveTheirs {
		return nil
	}
	// Theirs whole: its ancestors must be directories in ours too.
	if c.New != nil {
		for a := parent(c.Path); a != ""; a = parent(a) {
			if oc, ok := p.o[a]; ok && (oc.New == nil || oc.New.Kind != KindDir) {
				te, ok, err := p.theirs.Lstat(a)
				if err != nil || !ok {
					return errdefs.Newf(errdefs.ErrConflict, "%q changed during the merge", "/"+a)
				}
				if err := p.take(a, &te, true); err != nil {
					return err
				}
			}
		}
	}
	if c.New == nil || c.New.Kind != KindDir {
		// Whatever ours has under a directory theirs removed goes too.
		for path, oc := range p.o {
			if strings.HasPrefix(path, c.Path+"/") && oc.New != nil {
				p.ops[path] = Op{Path: path, Action: ActDelete, Conflict: true}
			}
		}
	}
	return p.take(c.Path, c.New, true)
}

// parent is rel's parent ("" for a top-level name).
func parent(rel string) string {
	d, _ := split(rel)
	return d
}

// change plans theirs' change c.
func (p *planner) change(c Change) error {
	if c.New != nil {
		for a := parent(c.Path); a != ""; a = parent(a) {
			if oc, ok := p.o[a]; ok && (oc.New == nil || oc.New.Kind != KindDir) {
				return p.conflict(c) // ours removed (or replaced) its directory
			}
		}
	}
	if c.New == nil || c.New.Kind != KindDir {
		for path, oc := range p.o {
			if strings.HasPrefix(path, c.Path+"/") && oc.New != nil {
				return p.conflict(c) // ours changed something under what theirs removed
			}
		}
	}
	oc, both := p.o[c.Path]
	if !both {
		return p.take(c.Path, c.New, false)
	}
	if oc.New == nil && c.New == nil {
		return nil
	}
	if oc.New == nil || c.New == nil {
		return p.conflict(c)
	}
	same, err := sameEntry(p.ours, oc.New, p.theirs, c.New)
	if err != nil || same {
		return err
	}
	switch {
	case oc.New.Kind == KindDir && c.New.Kind == KindDir:
		if c.Old == nil || (oc.New.Mode == c.Old.Mode && oc.New.UID == c.Old.UID && oc.New.GID == c.Old.GID) {
			return p.take(c.Path, c.New, false)
		}
		if c.New.Mode == c.Old.Mode && c.New.UID == c.Old.UID && c.New.GID == c.Old.GID {
			return nil
		}
	case oc.New.Kind == KindFile && c.New.Kind == KindFile:
		return p.mergeText(c, oc)
	}
	return p.conflict(c)
}

// mergeText merges the text file both sides changed at c.Path by lines.
func (p *planner) mergeText(c, oc Change) error {
	if oc.New.Size > MaxMergeTextBytes || c.New.Size > MaxMergeTextBytes {
		return p.conflict(c)
	}
	var base []byte
	if c.Old != nil && c.Old.Kind == KindFile {
		if c.Old.Size > MaxMergeTextBytes {
			return p.conflict(c)
		}
		var err error
		if base, err = p.base.ReadFile(c.Path, MaxMergeTextBytes); err != nil {
			return err
		}
	}
	ob, err := p.ours.ReadFile(c.Path, MaxMergeTextBytes)
	if err != nil {
		return err
	}
	tb, err := p.theirs.ReadFile(c.Path, MaxMergeTextBytes)
	if err != nil {
		return err
	}
	if IsBinary(base) || IsBinary(ob) || IsBinary(tb) {
		return p.conflict(c)
	}
	merged, ok := Merge3(string(base), string(ob), string(tb))
	if !ok {
		return p.conflict(c)
	}
	mode, uid, gid := oc.New.Mode, oc.New.UID, oc.New.GID
	if c.Old != nil && oc.New.Mode == c.Old.Mode {
		mode = c.New.Mode
	}
	p.ops[c.Path] = Op{Path: c.Path, Action: ActWrite, Mode: mode, UID: uid, GID: gid, Data: []byte(merged), Merged: true}
	return nil
}

// sameEntry reports whether entries a of tree at and b of tree bt are
// the same content: kind, mode, owner, target, bytes.
func sameEntry(at *Tree, a *Entry, bt *Tree, b *Entry) (bool, error) {
	if a.Kind != b.Kind || a.Mode != b.Mode || a.UID != b.UID || a.GID != b.GID || a.Target != b.Target || a.Rdev != b.Rdev {
		return false, nil
	}
	if a.Kind != KindFile {
		return true, nil
	}
	if a.Size != b.Size {
		return false, nil
	}
	return SameContent(at, a.Path, bt, b.Path)
}
