package bench

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/testnet"
)

// GroupBroker is the credential broker's rows: one HTTPS GET of a small
// body, a new connection each, to a server in a network namespace of its
// own, from a sandbox: to a name with a secret (the egress proxy
// terminates TLS with the session's CA, puts the value in the header and
// makes a new verified TLS connection upstream) and to a name without one
// (TLS passed through by SNI), beside the same GET by a host process
// straight to the server.
const GroupBroker = "broker"

// The broker rows' operations.
const (
	// OpBrokerHTTPS is the GET to the secret's host, through the broker.
	OpBrokerHTTPS = "broker: HTTPS GET with a secret (TLS terminated and re-made)"
	// OpPassthroughHTTPS is the GET to a host without a secret.
	OpPassthroughHTTPS = "broker: HTTPS GET without a secret (TLS passed through)"
)

const (
	// brokerBenchAddr is the HTTPS server (198.51.100.0/24, one host route).
	brokerBenchAddr = "198.51.100.61"
	// brokerSecretName and brokerPlainName both resolve to it (the
	// private daemon's egress resolver); only the first has a secret.
	brokerSecretName = "secret.bench"
	brokerPlainName  = "plain.bench"
	// brokerUpstreamCAFile is where the private daemon finds the server's
	// CA (serve --broker-upstream-ca), in its data directory.
	brokerUpstreamCAFile = "bench-upstream-ca.pem"
)

// brokerFetch makes one HTTPS GET of argv[1] (a new connection; the
// session's trust store, which holds its broker CA; no proxy from the
// environment: the transparent path) and prints the seconds it took,
// measured where it runs.
const brokerFetch = `import os, ssl, sys, time, urllib.request
ctx = ssl.create_default_context(cafile=sys.argv[2] if len(sys.argv) > 2 else None)
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=ctx))
req = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + os.environ.get("BENCHKEY", "none")})
t = time.perf_counter()
with opener.open(req, timeout=30) as r:
    body = r.read()
print(len(body), time.perf_counter() - t)
`

// brokerUpstream is the bench's HTTPS server's certificate (for both
// names, issued by a CA of the run) and that CA's PEM.
type brokerUpstream struct {
	cert  tls.Certificate
	caPEM []byte
}

// newBrokerUpstream makes the run's CA and the server's certificate.
func newBrokerUpstream() (*brokerUpstream, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "forkbox bench upstream CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: brokerSecretName},
		DNSNames: []string{brokerSecretName, brokerPlainName}, IPAddresses: []net.IP{net.ParseIP(brokerBenchAddr)}, NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	return &brokerUpstream{cert: tls.Certificate{Certificate: [][]byte{der, caDER}, PrivateKey: key},
		caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})}, nil
}

// measureBroker measures the broker rows (GroupBroker) from one runc
// session with a network allowing both names and the secret, made
// untimed, interleaved with the host process. It needs the private daemon.
func (e *env) measureBroker(ctx context.Context) []Result {
	f := e.fb
	ops := []string{OpBrokerHTTPS, OpPassthroughHTTPS}
	if f.d == nil || f.upstream == nil {
		return failOps(ops, SystemForkbox, errors.New("needs the private daemon (its resolver and upstream CA know the bench's server); not with a daemon URL"))
	}
	h, err := testnet.Start(brokerBenchAddr)
	if err != nil {
		return failOps(ops, SystemForkbox, fmt.Errorf("the server's namespace: %w", err))
	}
	defer h.Close()
	l, err := h.ListenTCP(443)
	if err != nil {
		return failOps(ops, SystemForkbox, err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, TLSConfig: &tls.Config{Certificates: []tls.Certificate{f.upstream.cert}},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "ok") })}
	go func() { _ = srv.ServeTLS(l, "", "") }()
	defer srv.Close()

	if _, _, err := f.c.SetSecret(ctx, "benchkey", []string{brokerSecretName}, "", []byte("bench-secret-value")); err != nil {
		return failOps(ops, SystemForkbox, err)
	}
	defer f.c.DeleteSecret(context.WithoutCancel(ctx), "benchkey")
	s, _, err := f.createWith(ctx, client.CreateRequest{Secrets: []string{"benchkey"},
		Network: &client.Network{Allow: []string{brokerSecretName + ":443", brokerPlainName + ":443"}}})
	if err != nil {
		return failOps(ops, SystemForkbox, err)
	}
	defer f.destroy(ctx, s.ID)
	for name, data := range map[string][]byte{"/tmp/fetch.py": []byte(brokerFetch), "/tmp/upstream-ca.pem": f.upstream.caPEM} {
		if _, err := f.c.Upload(ctx, s.ID, name, bytes.NewReader(data), int64(len(data)), ""); err != nil {
			return failOps(ops, SystemForkbox, err)
		}
	}
	caFile := filepath.Join(f.dataDir, brokerUpstreamCAFile)
	inSandbox := func(ctx context.Context, name string, argv ...string) (time.Duration, error) {
		var out, errOut bytes.Buffer
		res, err := f.c.Exec(ctx, s.ID, client.ExecRequest{Argv: append([]string{"python3", "/tmp/fetch.py", "https://" + name + "/"}, argv...),
			TimeoutS: 60}, &out, &errOut)
		if err != nil {
			return 0, err
		}
		if res.ExitCode != 0 {
			return 0, fmt.Errorf("GET https://%s/ in the sandbox: exit %d: %s", name, res.ExitCode, lastLine(errOut.String()))
		}
		return parseSeconds(out.String())
	}
	onHost := func(ctx context.Context) (time.Duration, error) {
		out, err := exec.CommandContext(ctx, "python3", "-c", brokerFetch, "https://"+brokerBenchAddr+"/", caFile).Output()
		if err != nil {
			return 0, fmt.Errorf("GET on the host: %w", err)
		}
		return parseSeconds(string(out))
	}
	e.opts.progressf("broker: HTTPS GET with and without a secret x %d, interleaved with a host process", e.opts.Warmup+e.opts.N)
	rows := interleave(ctx, e.opts.Warmup, e.opts.N, ops, []contender{
		{system: SystemForkbox, step: func(ctx context.Context) ([]time.Duration, error) {
			a, err := inSandbox(ctx, brokerSecretName)
			if err != nil {
				return nil, err
			}
			b, err := inSandbox(ctx, brokerPlainName, "/tmp/upstream-ca.pem")
			return []time.Duration{a, b}, err
		}},
		{system: SystemHostDirect, step: func(ctx context.Context) ([]time.Duration, error) {
			a, err := onHost(ctx)
			if err != nil {
				return nil, err
			}
			return []time.Duration{a, a}, nil
		}},
	})
	var broker, plain float64
	for _, r := range rows {
		if r.System == SystemForkbox && r.Operation == OpBrokerHTTPS {
			broker = r.P50MS
		}
		if r.System == SystemForkbox && r.Operation == OpPassthroughHTTPS {
			plain = r.P50MS
		}
	}
	for i, r := range rows {
		if r.System == SystemForkbox && r.Operation == OpBrokerHTTPS && broker > 0 && plain > 0 {
			rows[i].Note = strings.TrimSuffix(fmt.Sprintf("adds %.2f ms at p50 over pass-through (target <= 2); %s", broker-plain, r.Note), "; ")
		}
	}
	return rows
}

// parseSeconds reads a fetch script's "BYTES SECONDS" line.
func parseSeconds(out string) (time.Duration, error) {
	var n int64
	var s float64
	if _, err := fmt.Sscan(strings.TrimSpace(out), &n, &s); err != nil || n <= 0 {
		return 0, fmt.Errorf("unexpected output %q", lastLine(out))
	}
	return time.Duration(s * float64(time.Second)), nil
}

// writeUpstreamCA writes the run's upstream CA where the private daemon
// reads it (in its data directory dir) and returns the path.
func (u *brokerUpstream) writeUpstreamCA(dir string) (string, error) {
	p := filepath.Join(dir, brokerUpstreamCAFile)
	return p, os.WriteFile(p, u.caPEM, 0o644)
}
