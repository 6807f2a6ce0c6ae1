package client

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestRunCodeKeepsBounded proves RunCode keeps at most MaxCodeKept bytes
// of a cell's stdout however much the stream carries, counts the rest in
// Dropped, and still hands every line to onLine.
func TestRunCodeKeepsBounded(t *testing.T) {
	chunk := strings.Repeat("A", 1<<20)
	const chunks = 24 // 24 MiB of stdout, past the 16 MiB kept
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bw := bufio.NewWriter(w)
		enc := json.NewEncoder(bw)
		for range chunks {
			_ = enc.Encode(map[string]any{"type": "stdout", "text": chunk})
		}
		_ = enc.Encode(map[string]any{"type": "end_of_execution"})
		_ = bw.Flush()
	}))
	defer srv.Close()
	seen := 0
	ex, err := New(srv.URL, "k", nil).RunCode(context.Background(), "s", CodeRequest{Code: "x"}, func(l CodeLine) {
		seen += len(l.Text)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(ex.Stdout) != MaxCodeKept || ex.Dropped != int64(chunks<<20-MaxCodeKept) || seen != chunks<<20 {
		t.Fatalf("kept %d, dropped %d, onLine saw %d; want %d, %d, %d",
			len(ex.Stdout), ex.Dropped, seen, MaxCodeKept, chunks<<20-MaxCodeKept, chunks<<20)
	}
}

// TestRelativePath: relative sandbox paths are cleaned for the daemon's
// routes, and one climbing out of the working directory is refused.
func TestRelativePath(t *testing.T) {
	for in, want := range map[string]string{"a/../b": "b", "./x.txt": "x.txt", "/etc/../tmp": "/etc/../tmp", "d/": "d/", "a/./d/": "a/d/", "plain.txt": "plain.txt"} {
		if got, err := relativePath(in); err != nil || got != want {
			t.Errorf("relativePath(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"..", "../x", "a/../../x"} {
		if _, err := relativePath(bad); err == nil {
			t.Errorf("relativePath(%q): no error", bad)
		}
	}
}
