package mcp

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestInProcessStreams: the response arrives once the header is written
// and its body as the handler writes it, not when the handler returns.
func TestInProcessStreams(t *testing.T) {
	next := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, "one\n")
		w.(http.Flusher).Flush()
		<-next
		io.WriteString(w, "two\n")
	})
	hc := &http.Client{Transport: InProcess(h, "")}
	resp, err := hc.Get("http://x/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, header %v", resp.StatusCode, resp.Header)
	}
	br := bufio.NewReader(resp.Body)
	if l, err := br.ReadString('\n'); l != "one\n" || err != nil {
		t.Fatalf("first line %q, %v", l, err)
	}
	close(next)
	rest, err := io.ReadAll(br)
	if string(rest) != "two\n" || err != nil {
		t.Fatalf("rest %q, %v", rest, err)
	}
}

// TestInProcessRequest: the handler gets the body, the path and query,
// and the request id; an answer without a written header is a 200.
func TestInProcessRequest(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get("X-Request-Id")+" "+string(b))
	})
	hc := &http.Client{Transport: InProcess(h, "req-1")}
	resp, err := hc.Post("http://x/a/b?c=d", "text/plain", strings.NewReader("body"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(b) != "POST /a/b?c=d req-1 body" {
		t.Fatalf("%d %q", resp.StatusCode, b)
	}
}

// TestInProcessClose: closing the body ends the handler's context and
// fails its writes, as a closed connection would.
func TestInProcessClose(t *testing.T) {
	done := make(chan error, 1)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		<-r.Context().Done()
		_, err := io.WriteString(w, "late")
		done <- err
	})
	hc := &http.Client{Transport: InProcess(h, "")}
	resp, err := hc.Get("http://x/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a write after the body was closed succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's context did not end when the body was closed")
	}
}

// TestInProcessPanic: a handler's panic (http.ErrAbortHandler too) ends
// the body with an error instead of the process.
func TestInProcessPanic(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "partial")
		panic(http.ErrAbortHandler)
	})
	hc := &http.Client{Transport: InProcess(h, "")}
	resp, err := hc.Get("http://x/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if string(b) != "partial" || err == nil || errors.Is(err, io.EOF) {
		t.Fatalf("%q, %v; want the partial body and an error", b, err)
	}
}
