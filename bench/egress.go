package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/testnet"
	"github.com/forkbox/forkbox/netpolicy"
)

// GroupEgress is the egress rows: a 100 MiB HTTP download from a host
// outside the sandbox, through the egress service (the transparent path:
// port 80 redirected to the daemon's HTTP proxy, which checks the
// allow-list and counts the bytes), from a runc-tier and a gVisor-tier
// sandbox, beside the same download made directly by a host process.
const GroupEgress = "egress"

// The egress rows' operations.
const (
	// OpEgressRunc is the download from a runc-tier sandbox.
	OpEgressRunc = "egress: 100 MiB HTTP download, runc tier"
	// OpEgressGVisor is the download from a gVisor-tier sandbox (its
	// network stack is gVisor's netstack in the Sentry).
	OpEgressGVisor = "egress: 100 MiB HTTP download, gvisor tier"
)

// SystemHostDirect is the same download made by a process on the host,
// straight to the server (no egress service).
const SystemHostDirect = "host process, direct"

const (
	// egressBenchAddr is the bench's download server: a network namespace
	// of its own on the documentation range tests use, with a host route
	// to this one address only.
	egressBenchAddr = "198.51.100.60"
	// egressBenchName is the name sandboxes fetch it by (the private
	// daemon's egress resolver maps it; nothing is looked up outside).
	egressBenchName = "egress.bench"
	// egressBytes is the download's size.
	egressBytes = 100 << 20
)

// egressFetch downloads argv[1] to the end, with no proxy from the
// environment (the transparent path), and prints the bytes read and the
// seconds the download took, measured where it runs (so that starting
// Python and the exec's round trip are not in the figure).
const egressFetch = `import sys, time, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
t = time.perf_counter()
n = 0
with opener.open(sys.argv[1], timeout=300) as r:
    while True:
        b = r.read(1 << 20)
        if not b:
            break
        n += len(b)
print(n, time.perf_counter() - t)
`

// egressResolver and egressTestNetworks are what a private daemon is
// started with so that sandboxes may reach the bench's server.
var (
	egressResolver = netpolicy.MapResolver{egressBenchName: {netip.MustParseAddr(egressBenchAddr)},
		brokerSecretName: {netip.MustParseAddr(brokerBenchAddr)}, brokerPlainName: {netip.MustParseAddr(brokerBenchAddr)}}
	egressTestNetworks = []netip.Prefix{netip.MustParsePrefix(egressBenchAddr + "/32"), netip.MustParsePrefix(brokerBenchAddr + "/32")}
)

// measureEgress measures the egress rows (GroupEgress): one runc and one
// gVisor session with a network allowing the server, made untimed, and
// the host process, interleaved. It needs the private daemon (whose
// resolver knows the server's name) and root (the server's namespace).
func (e *env) measureEgress(ctx context.Context) []Result {
	f := e.fb
	ops := []string{OpEgressRunc, OpEgressGVisor}
	if f.d == nil {
		return failOps(ops, SystemForkbox, errors.New("needs the private daemon (its egress resolver maps the bench's server); not with a daemon URL"))
	}
	srv, err := startEgressServer()
	if err != nil {
		return failOps(ops, SystemForkbox, err)
	}
	defer srv.Close()
	url := "http://" + egressBenchName + "/big"
	netw := &client.Network{Allow: []string{egressBenchName + ":80"}, MaxEgressBytes: 1 << 40}
	sessions := map[string]string{}
	for _, iso := range []string{"", driverGVisor} {
		if iso == driverGVisor && !f.hasDriver(ctx, driverGVisor) {
			continue
		}
		s, _, err := f.createWith(ctx, client.CreateRequest{Isolation: iso, Network: netw})
		if err != nil {
			return failOps(ops, SystemForkbox, err)
		}
		defer f.destroy(ctx, s.ID)
		if _, err := f.c.Upload(ctx, s.ID, "/tmp/fetch.py", strings.NewReader(egressFetch), int64(len(egressFetch)), ""); err != nil {
			return failOps(ops, SystemForkbox, err)
		}
		sessions[iso] = s.ID
	}
	inSandbox := func(ctx context.Context, iso string) (time.Duration, error) {
		id, ok := sessions[iso]
		if !ok {
			return 0, errors.New("the daemon has no gvisor driver (install runsc from bookworm-backports)")
		}
		var out, errOut bytes.Buffer
		res, err := f.c.Exec(ctx, id, client.ExecRequest{Argv: []string{"python3", "/tmp/fetch.py", url}, TimeoutS: 300}, &out, &errOut)
		if err != nil {
			return 0, err
		}
		if res.ExitCode != 0 {
			return 0, fmt.Errorf("download in the sandbox: exit %d: %s", res.ExitCode, lastLine(errOut.String()))
		}
		return parseFetch(out.String())
	}
	onHost := func(ctx context.Context) (time.Duration, error) {
		out, err := exec.CommandContext(ctx, "python3", "-c", egressFetch, "http://"+egressBenchAddr+"/big").Output()
		if err != nil {
			return 0, fmt.Errorf("download on the host: %w", err)
		}
		return parseFetch(string(out))
	}
	e.opts.progressf("egress: a 100 MiB download from a runc and a gVisor sandbox x %d, interleaved with a host process", e.opts.Warmup+e.opts.N)
	rows := interleave(ctx, e.opts.Warmup, e.opts.N, ops, []contender{
		{system: SystemForkbox, step: func(ctx context.Context) ([]time.Duration, error) {
			a, err := inSandbox(ctx, "")
			if err != nil {
				return nil, err
			}
			b, err := inSandbox(ctx, driverGVisor)
			return []time.Duration{a, b}, err
		}},
		{system: SystemHostDirect, step: func(ctx context.Context) ([]time.Duration, error) {
			a, err := onHost(ctx)
			if err != nil {
				return nil, err
			}
			b, err := onHost(ctx)
			return []time.Duration{a, b}, err
		}},
	})
	for i, r := range rows {
		if r.N > 0 {
			rows[i].Note = strings.TrimSuffix(fmt.Sprintf("%.0f MB/s at p50; %s", float64(egressBytes)/1e6/(r.P50MS/1000), r.Note), "; ")
		}
	}
	return rows
}

// parseFetch reads egressFetch's output: the bytes (which must be
// egressBytes) and the seconds.
func parseFetch(out string) (time.Duration, error) {
	f := strings.Fields(out)
	if len(f) != 2 {
		return 0, fmt.Errorf("download: unexpected output %q", lastLine(out))
	}
	n, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || n != egressBytes {
		return 0, fmt.Errorf("download: read %s bytes, want %d", f[0], egressBytes)
	}
	s, err := strconv.ParseFloat(f[1], 64)
	if err != nil {
		return 0, fmt.Errorf("download: seconds %q", f[1])
	}
	return time.Duration(s * float64(time.Second)), nil
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// egressServer is the bench's download server in its own namespace.
type egressServer struct {
	host *testnet.Host
	srv  *http.Server
}

// startEgressServer starts the download server at egressBenchAddr:80,
// serving egressBytes of random bytes at /big.
func startEgressServer() (*egressServer, error) {
	h, err := testnet.Start(egressBenchAddr)
	if err != nil {
		return nil, fmt.Errorf("the download server's namespace: %w", err)
	}
	l, err := h.ListenTCP(80)
	if err != nil {
		_ = h.Close()
		return nil, err
	}
	chunk := make([]byte, 1<<20)
	_, _ = rand.Read(chunk)
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/big" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(egressBytes))
		for i := 0; i < egressBytes/len(chunk); i++ {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})}
	go func() { _ = srv.Serve(l) }()
	return &egressServer{host: h, srv: srv}, nil
}

// Close stops the server and removes its namespace.
func (s *egressServer) Close() error {
	return errors.Join(s.srv.Close(), s.host.Close())
}
