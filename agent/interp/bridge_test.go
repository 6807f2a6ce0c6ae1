package interp

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestBridge runs the bridge with a real kernel: state kept between cells,
// the last value as the main result, an exception as an error line, and a
// line plot's PNG with its chart JSON.
func TestBridge(t *testing.T) {
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import ipykernel, jupyter_client, matplotlib").Run(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("python3-ipykernel, python3-jupyter-client or python3-matplotlib missing: %v", err)
		}
		t.Skipf("python3-ipykernel, python3-jupyter-client or python3-matplotlib missing: %v", err)
	}
	cells := []string{
		`{"op":"execute","id":1,"code":"x = 41\nprint('hi')"}`,
		`{"op":"execute","id":2,"code":"x + 1"}`,
		`{"op":"execute","id":3,"code":"1/0"}`,
		`{"op":"execute","id":4,"code":"import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.title('t')\nplt.show()"}`,
	}
	cmd := exec.Command(py, "-I", "-c", BridgeSource, t.TempDir(), ChartsSource)
	cmd.Stdin = strings.NewReader(strings.Join(cells, "\n") + "\n")
	cmd.Env = append(os.Environ(), "PYDEVD_DISABLE_FILE_VALIDATION=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	guard := time.AfterFunc(120*time.Second, func() { _ = cmd.Process.Kill() })
	defer guard.Stop()
	var lines []map[string]any
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 32<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("bad line %q: %v", sc.Text(), err)
		}
		lines = append(lines, m)
	}
	_ = cmd.Wait()
	var cell [][]map[string]any
	cur := []map[string]any{}
	for _, m := range lines {
		if m["type"] == "end_of_execution" {
			cell = append(cell, cur)
			cur = nil
			continue
		}
		if m["type"] != "ready" {
			cur = append(cur, m)
		}
	}
	if len(cell) != 4 {
		t.Fatalf("got %d cells, want 4: %v", len(cell), lines)
	}
	find := func(c []map[string]any, typ string) map[string]any {
		for _, m := range c {
			if m["type"] == typ {
				return m
			}
		}
		t.Fatalf("no %s line in %v", typ, c)
		return nil
	}
	if m := find(cell[0], "stdout"); m["text"] != "hi\n" {
		t.Errorf("stdout = %v", m)
	}
	if m := find(cell[1], "result"); m["text"] != "42" || m["is_main_result"] != true {
		t.Errorf("result = %v", m)
	}
	if m := find(cell[2], "error"); m["name"] != "ZeroDivisionError" {
		t.Errorf("error = %v", m)
	}
	r := find(cell[3], "result")
	chart, _ := r["chart"].(map[string]any)
	if r["png"] == nil || chart == nil || chart["type"] != "line" || chart["title"] != "t" {
		t.Errorf("plot result: png %v, chart %v", r["png"] != nil, chart)
	}
}
