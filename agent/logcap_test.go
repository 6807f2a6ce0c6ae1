package agent

import (
	"bytes"
	"strings"
	"testing"
)

// TestCappedWriter: whole writes pass until the cap, then one note, then
// nothing, and callers never see an error.
func TestCappedWriter(t *testing.T) {
	var buf bytes.Buffer
	w := newCappedWriter(&buf, 25)
	for i := 0; i < 1000; i++ {
		n, err := w.Write([]byte("0123456789\n"))
		if n != 11 || err != nil {
			t.Fatalf("write %d = %d, %v", i, n, err)
		}
	}
	want := "0123456789\n0123456789\n" + logTruncatedNote
	if buf.String() != want {
		t.Fatalf("log = %q, want %q", buf.String(), want)
	}
	if strings.Count(buf.String(), logTruncatedNote) != 1 {
		t.Fatal("the truncation note repeats")
	}
}
