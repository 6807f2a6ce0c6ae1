package changes

import "testing"

func TestMerge3(t *testing.T) {
	base := "a\nb\nc\nd\ne\nf\ng\n"
	for _, tc := range []struct {
		name, ours, theirs, want string
		ok                       bool
	}{
		{"disjoint", "A\nb\nc\nd\ne\nf\ng\n", "a\nb\nc\nd\ne\nf\nG\n", "A\nb\nc\nd\ne\nf\nG\n", true},
		{"same change", "a\nB\nc\nd\ne\nf\ng\n", "a\nB\nc\nd\ne\nf\ng\n", "a\nB\nc\nd\ne\nf\ng\n", true},
		{"one side", base, "a\nb\nc\nD\ne\nf\ng\n", "a\nb\nc\nD\ne\nf\ng\n", true},
		{"overlap", "a\nb\nX\nd\ne\nf\ng\n", "a\nb\nY\nd\ne\nf\ng\n", "", false},
		{"adjacent", "a\nb\nX\nd\ne\nf\ng\n", "a\nb\nc\nY\ne\nf\ng\n", "", false},
		{"insert and delete apart", "a\nnew\nb\nc\nd\ne\nf\ng\n", "a\nb\nc\nd\ne\ng\n", "a\nnew\nb\nc\nd\ne\ng\n", true},
		{"both append differently", base + "x\n", base + "y\n", "", false},
		{"both append the same and one edits", "A\nb\nc\nd\ne\nf\ng\nz\n", base + "z\n", "A\nb\nc\nd\ne\nf\ng\nz\n", true},
		{"no trailing newline", "a\nb\nc\nd\ne\nf\ng", "A\nb\nc\nd\ne\nf\ng\n", "A\nb\nc\nd\ne\nf\ng", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := Merge3(base, tc.ours, tc.theirs)
			if ok != tc.ok || got != tc.want {
				t.Fatalf("Merge3 = %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}
