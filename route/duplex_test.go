package route

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/api/e2b"
	"github.com/forkbox/forkbox/fleet"
)

// TestForwardFullDuplex: the host that holds a session answers an envd
// stream (headers flushed) before the client has sent the end of its
// request body, as a Connect server stream may. The router in between
// must keep copying the body after it passed the answer's headers on;
// without full duplex the HTTP/1 server closed the request body there,
// the upstream connection was torn down and the client's stream was cut.
func TestForwardFullDuplex(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	f, err := fleet.Start(ctx, fleet.Options{StoreDir: t.TempDir()}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	dir, err := fleet.OpenDirectory(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	const id = "duplexaaaaaaaaaaaaaa"
	if err := dir.Put(ctx, fleet.Location{Kind: fleet.KindSession, ID: id, Host: "c"}); err != nil {
		t.Fatal(err)
	}
	// c answers at once, then reads the whole body, then ends the stream.
	c := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		w.WriteHeader(http.StatusOK)
		fmt.Fprintln(w, "started")
		w.(http.Flusher).Flush()
		n, err := io.Copy(io.Discard, r.Body)
		fmt.Fprintf(w, "end %d %v\n", n, err)
	}))
	t.Cleanup(func() { c.CloseClientConnections(); c.Close() })
	hosts := []fleet.Host{
		{ID: "a", API: "http://127.0.0.1:1", Version: "dev", State: fleet.HostReady, Placeable: true},
		{ID: "c", API: c.URL, Version: "dev", State: fleet.HostReady, Placeable: true},
	}
	a := httptest.NewServer(New(Options{Self: "a", Local: http.NotFoundHandler(), Key: DeriveKey("a-fleet-secret-of-at-least-32-bytes-long"),
		Directory: func() (*fleet.Directory, error) { return dir, nil },
		Hosts:     func(context.Context) ([]fleet.Host, error) { return hosts, nil }, Log: log}))
	t.Cleanup(func() { a.CloseClientConnections(); a.Close() })

	pr, pw := io.Pipe()
	req, err := http.NewRequest(http.MethodPost, a.URL+"/process.Process/Start", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(e2b.SandboxIDHeader, id)
	go pw.Write([]byte("first part;"))
	// Bounded: without full duplex the call hangs instead of failing.
	type answer struct {
		resp *http.Response
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		got <- answer{resp, err}
	}()
	var resp *http.Response
	select {
	case a := <-got:
		if a.err != nil {
			t.Fatal(a.err)
		}
		resp = a.resp
	case <-time.After(15 * time.Second):
		pw.CloseWithError(io.ErrUnexpectedEOF)
		t.Fatal("no answer through the router in 15 s: the forwarded stream is stuck")
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "started\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	// The rest of the body only after the answer began.
	time.Sleep(100 * time.Millisecond)
	go func() {
		// Not in the test's goroutine: a proxy that stopped reading
		// the body would block this write for good.
		pw.Write([]byte("second part"))
		pw.Close()
	}()
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatalf("the forwarded stream was cut: %v (read %q)", err, rest)
	}
	if got, want := strings.TrimSpace(string(rest)), fmt.Sprintf("end %d <nil>", len("first part;second part")); got != want {
		t.Fatalf("the stream ended %q, want %q", got, want)
	}
}
