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

// layerTable reads the fenced block that starts with "```layers" in
// docs/ARCHITECTURE.md: lines "N name: pkg pkg ..." (N the layer, 0 the
// lowest; packages relative to the module; "pkg/..." covers pkg and
// everything under it).
func layerTable(t *testing.T) (exact map[string]int, trees map[string]int) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	exact, trees = map[string]int{}, map[string]int{}
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
		head, pkgs, ok := strings.Cut(line, ":")
		if !ok {
			t.Fatalf("layers block: %q has no colon", line)
		}
		n, err := strconv.Atoi(strings.Fields(head)[0])
		if err != nil {
			t.Fatalf("layers block: %q does not start with a layer number", line)
		}
		for _, p := range strings.Fields(pkgs) {
			if tree, ok := strings.CutSuffix(p, "/..."); ok {
				trees[tree] = n
			} else {
				exact[p] = n
			}
		}
	}
	if len(exact)+len(trees) == 0 {
		t.Fatal("docs/ARCHITECTURE.md has no layers block")
	}
	return exact, trees
}

// layerOf is the layer of package rel (relative to the module), or -1.
func layerOf(rel string, exact, trees map[string]int) int {
	if n, ok := exact[rel]; ok {
		return n
	}
	best, layer := -1, -1
	for tree, n := range trees {
		if (rel == tree || strings.HasPrefix(rel, tree+"/")) && len(tree) > best {
			best, layer = len(tree), n
		}
	}
	return layer
}

type pkg struct {
	ImportPath string
	Imports    []string
}

// TestImportsRunDownward checks every package of the module (tests'
// imports not included: a test may drive its package from above) against
// the layers block.
func TestImportsRunDownward(t *testing.T) {
	exact, trees := layerTable(t)
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = filepath.Join("..", "..")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(out))
	var problems []string
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		if rel == "e2e" || rel == "internal/layers" {
			continue // tests only
		}
		from := layerOf(rel, exact, trees)
		if from < 0 {
			problems = append(problems, fmt.Sprintf("%s is in no layer of docs/ARCHITECTURE.md", rel))
			continue
		}
		for _, imp := range p.Imports {
			r, ok := strings.CutPrefix(imp, module+"/")
			if !ok {
				continue
			}
			if to := layerOf(r, exact, trees); to > from {
				problems = append(problems, fmt.Sprintf("%s (layer %d) imports %s (layer %d)", rel, from, r, to))
			}
		}
	}
	for _, p := range problems {
		t.Error(p)
	}
}
