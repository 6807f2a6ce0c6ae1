package template

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
	"github.com/forkbox/forkbox/storage/layercache"
)

func TestPublicAddr(t *testing.T) {
	for a, want := range map[string]bool{
		"8.8.8.8": true, "1.1.1.1": true, "2606:4700::1111": true,
		"127.0.0.1": false, "127.1.2.3": false, "::1": false, "10.1.2.3": false, "172.16.0.1": false,
		"192.168.1.1": false, "169.254.169.254": false, "100.64.0.1": false, "0.0.0.0": false, "::": false,
		"fd00::1": false, "fe80::1": false, "224.0.0.1": false, "255.255.255.255": false, "198.51.100.7": false,
		"::ffff:127.0.0.1": false, "::ffff:10.0.0.1": false, "::ffff:8.8.8.8": true, "64:ff9b::a00:1": false,
	} {
		if got := publicAddr(netip.MustParseAddr(a)); got != want {
			t.Errorf("publicAddr(%s) = %v, want %v", a, got, want)
		}
	}
}

func TestPlainAllowed(t *testing.T) {
	insecure := []string{"reg.lan:5000", "other.lan"}
	for host, want := range map[string]bool{
		"localhost:5000": true, "localhost": true, "127.0.0.1:80": true, "[::1]:5000": true,
		"reg.lan:5000": true, "REG.lan:5000": true, "reg.lan:5001": false, "other.lan:1234": true,
		"10.0.0.1:5000": false, "registry.example": false, "localhost.example:5000": false,
	} {
		if got := plainAllowed(host, insecure); got != want {
			t.Errorf("plainAllowed(%s) = %v, want %v", host, got, want)
		}
	}
}

// testCatalog is a catalog with a layer cache in a fresh data directory
// (no store: these pulls fail before anything is recorded).
func testCatalog(t *testing.T, p RegistryPolicy) (*Catalog, *layercache.Cache) {
	t.Helper()
	layout, err := datadir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := NewCatalog(layout, nil, storage.DefaultIDShift, nil, nil)
	lc, err := layercache.Open(layout.Layers(), 1<<20, c.LayersInUse)
	if err != nil {
		t.Fatal(err)
	}
	c.UsePull(lc, p)
	return c, lc
}

// TestPullTransportRefuses proves a pull's transport keeps to the policy:
// no plain HTTP to a registry not named insecure (here a name that is no
// loopback name), no connection to a loopback address for a caller that
// may only reach public ones, and a registry that never answers is a 504
// once the response timeout passes.
func TestPullTransportRefuses(t *testing.T) {
	hits := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits++ }))
	defer srv.Close()
	port := strings.TrimPrefix(srv.URL, "http://127.0.0.1")

	// Plain HTTP refused before anything is sent.
	tr := pullTransport(RegistryPolicy{}, PullOptions{AnyAddress: true})
	req, _ := http.NewRequest(http.MethodGet, "http://reg.example"+port+"/v2/", nil)
	_, err := tr.RoundTrip(req)
	var ph *plainHTTPError
	if !errors.As(err, &ph) {
		t.Fatalf("plain HTTP to a registry not named insecure: %v", err)
	}
	// A loopback address for a caller that may reach public ones only.
	tr = pullTransport(RegistryPolicy{}, PullOptions{})
	req, _ = http.NewRequest(http.MethodGet, srv.URL+"/v2/", nil)
	_, err = tr.RoundTrip(req)
	var ae *addressError
	if !errors.As(err, &ae) || hits != 0 {
		t.Fatalf("a tenant's request to 127.0.0.1: %v (hits %d), want an address error and no request", err, hits)
	}
	// ... unless the daemon names it private.
	tr = pullTransport(RegistryPolicy{PrivateRegistries: []string{"127.0.0.1"}}, PullOptions{})
	if resp, err := tr.RoundTrip(req); err != nil || hits != 1 {
		t.Fatalf("a request to a private registry named: %v (hits %d)", err, hits)
	} else {
		resp.Body.Close()
	}

	// A registry that accepts and never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	c, _ := testCatalog(t, RegistryPolicy{ResponseTimeout: 200 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ref := ln.Addr().String() + "/test/hang:1"
	_, err = c.Pull(ctx, "", "hang", ref, PullOptions{AnyAddress: true})
	var te *errdefs.TypedError
	if !errors.As(err, &te) || te.Type != ProblemRegistryUnreachable || !strings.Contains(err.Error(), ref) {
		t.Fatalf("pull from a registry that never answers: %v, want %s naming %s", err, ProblemRegistryUnreachable, ref)
	}
}

// TestPullArguments proves bad references, platforms and names are
// refused before any request, naming the field.
func TestPullArguments(t *testing.T) {
	c, _ := testCatalog(t, RegistryPolicy{})
	ctx := context.Background()
	for _, tc := range []struct {
		name, ref string
		o         PullOptions
		field     string
	}{
		{"ok", "", PullOptions{}, "ref"},
		{"ok", "Bad Ref", PullOptions{}, "ref"},
		{"ok", "a/b:" + strings.Repeat("x", 300), PullOptions{}, "ref"},
		{"ok", "alpine", PullOptions{Platform: "windows/amd64"}, "platform"},
		{"ok", "alpine", PullOptions{Platform: "linux"}, "platform"},
		{"ok", "alpine", PullOptions{Platform: "linux/amd64/v2/x"}, "platform"},
		{"Bad Name", "alpine", PullOptions{}, "name"},
		{"base", "alpine", PullOptions{}, "name"},
	} {
		_, err := c.Pull(ctx, "", tc.name, tc.ref, tc.o)
		if errdefs.Field(err) != tc.field {
			t.Errorf("Pull(%q, %q, %+v): %v, want a %s field error", tc.name, tc.ref, tc.o, err, tc.field)
		}
	}
	// Two pulls of one name at once: the second is a conflict.
	release, err := c.reserve("busy")
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if _, err := c.Pull(ctx, "", "busy", "alpine", PullOptions{}); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("a pull of a name being made: %v, want conflict", err)
	}
	if err := c.CheckImportName("busy"); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("CheckImportName of a name being made: %v, want conflict", err)
	}
}

// TestLayersInUse: the layers in use are the recorded templates'
// layer_digests; directories of installs under way are not read (their
// pulls pin their layers).
func TestLayersInUse(t *testing.T) {
	c, _ := testCatalog(t, RegistryPolicy{})
	for name, digests := range map[string][]string{
		"a":         {"sha256:" + strings.Repeat("1", 64), "sha256:" + strings.Repeat("2", 64)},
		"b":         {"sha256:" + strings.Repeat("2", 64)},
		"c":         nil,
		".tmp-0123": {"sha256:" + strings.Repeat("3", 64)},
	} {
		dir := c.layout.Template(name)
		if err := os.MkdirAll(dir, 0o711); err != nil {
			t.Fatal(err)
		}
		if err := storage.SaveTemplate(dir, &storage.Template{Name: name, LayerDigests: digests}); err != nil {
			t.Fatal(err)
		}
	}
	got, err := c.LayersInUse(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got["sha256:"+strings.Repeat("1", 64)] || !got["sha256:"+strings.Repeat("2", 64)] {
		t.Fatalf("LayersInUse = %v, want the two digests of a and b", got)
	}
}
