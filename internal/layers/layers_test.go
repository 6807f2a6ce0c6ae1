package layers

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/forkbox/forkbox"

// group is a set of packages: exact names and trees ("pkg/..." is pkg
// and everything under it), relative to the module.
type group []string

func (g group) has(rel string) bool {
	for _, p := range g {
		if tree, ok := strings.CutSuffix(p, "/..."); ok {
			if rel == tree || strings.HasPrefix(rel, tree+"/") {
				return true
			}
		} else if rel == p {
			return true
		}
	}
	return false
}

// rules is the "layers" block of docs/ARCHITECTURE.md.
type rules struct {
	layers []group // by layer number
	never  [][2]group
	only   [][2]group
}

// readRules parses the fenced block that starts with "```layers": lines
// "N name: pkgs" (layer N, 0 the lowest), "never A: B" and "only A: B".
func readRules(t *testing.T) rules {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	var r rules
	in := false
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "```layers":
			in = true
			continue
		case in && line == "```":
			in = false
		}
		if !in || line == "" {
			continue
		}
		head, rest, ok := strings.Cut(line, ":")
		if !ok {
			t.Fatalf("layers block: %q has no colon", line)
		}
		words := strings.Fields(head)
		switch words[0] {
		case "never", "only":
			pair := [2]group{words[1:], strings.Fields(rest)}
			if words[0] == "never" {
				r.never = append(r.never, pair)
			} else {
				r.only = append(r.only, pair)
			}
			continue
		}
		n, err := strconv.Atoi(words[0])
		if err != nil || n != len(r.layers) {
			t.Fatalf("layers block: %q: layers are numbered 0, 1, 2, ... in order", line)
		}
		r.layers = append(r.layers, strings.Fields(rest))
	}
	if len(r.layers) == 0 {
		t.Fatal("docs/ARCHITECTURE.md has no layers block")
	}
	return r
}

// layerOf is the layer of package rel, or -1 when no layer has it. The
// most specific entry wins: an exact name before a tree, a longer tree
// before a shorter one.
func (r rules) layerOf(rel string) int {
	best, layer := -1, -1
	for n, g := range r.layers {
		for _, p := range g {
			score := -1
			if tree, ok := strings.CutSuffix(p, "/..."); ok {
				if rel == tree || strings.HasPrefix(rel, tree+"/") {
					score = len(tree)
				}
			} else if rel == p {
				score = 1 << 20
			}
			if score > best {
				best, layer = score, n
			}
		}
	}
	return layer
}

type pkg struct {
	ImportPath string
	Imports    []string
}

// TestImportsFollowTheLayers checks every package of the module (the
// imports of its tests are not counted: a test may drive its package from
// above) against the layers block.
func TestImportsFollowTheLayers(t *testing.T) {
	r := readRules(t)
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	seen := 0
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		seen++
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if rel == "e2e" || rel == "internal/layers" {
			continue // tests only
		}
		for _, problem := range r.check(rel, p.Imports) {
			t.Error(problem)
		}
	}
	if seen < 10 {
		t.Fatalf("go list found %d packages", seen)
	}
}

// check lists what is wrong with package rel importing imports.
func (r rules) check(rel string, imports []string) []string {
	var problems []string
	from := r.layerOf(rel)
	if from < 0 {
		return []string{fmt.Sprintf("%s is in no layer of docs/ARCHITECTURE.md", rel)}
	}
	for _, imp := range imports {
		to, ok := strings.CutPrefix(imp, module+"/")
		if !ok {
			continue
		}
		if n := r.layerOf(to); n > from {
			problems = append(problems, fmt.Sprintf("%s (layer %d) imports %s (layer %d)", rel, from, to, n))
		}
		for _, rule := range r.never {
			if rule[0].has(rel) && rule[1].has(to) {
				problems = append(problems, fmt.Sprintf("%s imports %s, which the never rule %v: %v forbids", rel, to, rule[0], rule[1]))
			}
		}
		for _, rule := range r.only {
			if rule[1].has(to) && !rule[0].has(rel) {
				problems = append(problems, fmt.Sprintf("%s imports %s, which only %v may import", rel, to, rule[0]))
			}
		}
	}
	return problems
}

// TestRulesCatchWrongImports proves the checker refuses what the rules
// forbid: an upward import, a never pair, an only pair, a package in no
// layer.
func TestRulesCatchWrongImports(t *testing.T) {
	r := rules{
		layers: []group{{"errdefs", "node"}, {"store", "runtime/..."}, {"api", "api/..."}},
		never:  [][2]group{{{"api/..."}, {"store"}}},
		only:   [][2]group{{{"runtime/runc"}, {"node"}}},
	}
	cases := []struct {
		rel     string
		imports []string
		bad     bool
	}{
		{"store", []string{module + "/errdefs"}, false},
		{"errdefs", []string{module + "/store"}, true},
		{"api/e2b", []string{module + "/store"}, true},
		{"api", []string{module + "/runtime/runc"}, false},
		{"store", []string{module + "/node"}, true},
		{"runtime/runc", []string{module + "/node"}, false},
		{"nowhere", nil, true},
		{"store", []string{"fmt", "github.com/other/module"}, false},
	}
	for _, c := range cases {
		if got := r.check(c.rel, c.imports); (len(got) > 0) != c.bad {
			t.Errorf("%s importing %v: problems %v, want bad=%v", c.rel, c.imports, got, c.bad)
		}
	}
}
