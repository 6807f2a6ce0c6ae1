package changes

import (
	"slices"
	"strings"

	udiff "github.com/aymanbagabas/go-udiff"
)

// Merge3 merges two texts changed from a common base by lines (diff3):
// it computes each side's line edits against base (go-udiff's LCS), and
// groups edits of either side whose base ranges overlap or touch. A group
// only one side changed takes that side's lines; a group both changed
// the same way takes them once; any other group is a conflict. ok is
// false when there was one (merged is then empty): like git, edits to
// adjacent lines count as conflicting, since neither side saw the other's.
func Merge3(base, ours, theirs string) (merged string, ok bool) {
	if ours == theirs {
		return ours, true
	}
	if ours == base {
		return theirs, true
	}
	if theirs == base {
		return ours, true
	}
	type sided struct {
		udiff.Edit
		side int // 0 ours, 1 theirs
	}
	var all []sided
	for i, e := range [][]udiff.Edit{udiff.Lines(base, ours), udiff.Lines(base, theirs)} {
		for _, ed := range e {
			all = append(all, sided{ed, i})
		}
	}
	slices.SortStableFunc(all, func(a, b sided) int {
		if a.Start != b.Start {
			return a.Start - b.Start
		}
		return a.End - b.End
	})
	var out strings.Builder
	pos := 0
	for i := 0; i < len(all); {
		start, end := all[i].Start, all[i].End
		j := i + 1
		for j < len(all) && all[j].Start <= end {
			end = max(end, all[j].End)
			j++
		}
		group := all[i:j]
		// Each side's text for base[start:end] with its edits applied.
		var text [2]string
		var changed [2]bool
		for s := 0; s < 2; s++ {
			var b strings.Builder
			at := start
			for _, e := range group {
				if e.side != s {
					continue
				}
				changed[s] = true
				b.WriteString(base[at:e.Start])
				b.WriteString(e.New)
				at = e.End
			}
			b.WriteString(base[at:end])
			text[s] = b.String()
		}
		out.WriteString(base[pos:start])
		switch {
		case !changed[1]:
			out.WriteString(text[0])
		case !changed[0]:
			out.WriteString(text[1])
		case text[0] == text[1]:
			out.WriteString(text[0])
		default:
			return "", false
		}
		pos = end
		i = j
	}
	out.WriteString(base[pos:])
	return out.String(), true
}
