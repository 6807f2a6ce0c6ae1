package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/freeport"
)

// GroupPorts is the sandbox port rows: a small GET and a 100 MiB download
// from Python's http.server in a sandbox, through the daemon (forkbox's
// REST port path: client → daemon → the sandbox's agent → the server on
// the sandbox's loopback), beside the same requests to the same server
// run on the host's loopback.
const GroupPorts = "ports"

// The port rows' operations.
const (
	// OpPortRequest is GET of a 23-byte file.
	OpPortRequest = "ports: GET of a small file"
	// OpPortDownload is GET of a 100 MiB file, read to the end.
	OpPortDownload = "ports: 100 MiB download"
)

// SystemHostServer is the same server run as a host process, reached
// directly on the host's loopback.
const SystemHostServer = "same server on the host"

// portsDownloadBytes is the size of the download rows' file.
const portsDownloadBytes = 100 << 20

// portsServerPort is the port the server listens on in the sandbox.
const portsServerPort = 8000

// measurePorts measures the port rows (GroupPorts) in one sandbox made
// untimed, with python3's http.server serving the same two files there
// and on the host. Each row's note says what the daemon adds at the
// median (and, for the download, the rates in MB/s, 10^6 bytes a second).
func (e *env) measurePorts(ctx context.Context) []Result {
	f := e.fb
	ops := []string{OpPortRequest, OpPortDownload}
	hostURL, stop, err := hostHTTPServer(ctx)
	if err != nil {
		return failOps(ops, SystemForkbox, err)
	}
	defer stop()
	s, _, err := f.createWith(ctx, client.CreateRequest{DiskMB: 512})
	if err != nil {
		return failOps(ops, SystemForkbox, err)
	}
	defer f.destroy(ctx, s.ID)
	if err := f.sandboxHTTPServer(ctx, s.ID); err != nil {
		return failOps(ops, SystemForkbox, err)
	}
	sandboxGet := func(path string) func(ctx context.Context) (time.Duration, error) {
		return func(ctx context.Context) (time.Duration, error) {
			return timedGet(func() (*http.Response, error) { return f.c.PortGet(ctx, s.ID, portsServerPort, path) })
		}
	}
	hostGet := func(path string) func(ctx context.Context) (time.Duration, error) {
		return func(ctx context.Context) (time.Duration, error) {
			return timedGet(func() (*http.Response, error) {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, hostURL+path, nil)
				if err != nil {
					return nil, err
				}
				return http.DefaultClient.Do(req)
			})
		}
	}
	pair := func(small, big func(ctx context.Context) (time.Duration, error)) func(ctx context.Context) ([]time.Duration, error) {
		return func(ctx context.Context) ([]time.Duration, error) {
			a, err := small(ctx)
			if err != nil {
				return nil, err
			}
			b, err := big(ctx)
			return []time.Duration{a, b}, err
		}
	}
	e.opts.progressf("ports: a small GET and a 100 MiB download x %d, through the daemon and on the host", e.opts.Warmup+e.opts.N)
	rows := interleave(ctx, e.opts.Warmup, e.opts.N, ops, []contender{
		{system: SystemForkbox, step: pair(sandboxGet("/small.txt"), sandboxGet("/big.bin"))},
		{system: SystemHostServer, step: pair(hostGet("/small.txt"), hostGet("/big.bin"))},
	})
	return portNotes(rows)
}

// portNotes adds to the forkbox rows what the daemon adds over the host
// at p50 and p99, and to the download rows their rates.
func portNotes(rows []Result) []Result {
	host := map[string]Result{}
	for _, r := range rows {
		if r.System == SystemHostServer && r.N > 0 {
			host[r.Operation] = r
		}
	}
	mbps := func(ms float64) float64 { return float64(portsDownloadBytes) / 1e6 / (ms / 1000) }
	for i, r := range rows {
		if r.N == 0 {
			continue
		}
		var notes []string
		if h, ok := host[r.Operation]; ok && r.System == SystemForkbox {
			notes = append(notes, fmt.Sprintf("adds %.2f ms at p50, %.2f ms at p99 over the host", r.P50MS-h.P50MS, r.P99MS-h.P99MS))
		}
		if r.Operation == OpPortDownload {
			notes = append(notes, fmt.Sprintf("%.0f MB/s at p50", mbps(r.P50MS)))
		}
		if len(notes) > 0 {
			rows[i].Note = strings.Join(append(notes, r.Note), "; ")
			rows[i].Note = strings.TrimSuffix(rows[i].Note, "; ")
		}
	}
	return rows
}

// timedGet times get and reading its whole body; an answer other than
// 200 is an error.
func timedGet(get func() (*http.Response, error)) (time.Duration, error) {
	return timed(func() error {
		resp, err := get()
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			return fmt.Errorf("GET: HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
		}
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	})
}

// portsFiles writes the two files the port rows fetch (shell commands
// for the sandbox; the host writes them itself).
const portsFiles = "mkdir -p /tmp/www && cd /tmp/www && echo 'a small file to fetch' > small.txt && " +
	"head -c 104857600 /dev/urandom > big.bin"

// sandboxHTTPServer starts python3's http.server on 127.0.0.1:8000 in
// session id, serving the port rows' files, and waits until it answers
// through the daemon.
func (f *forkbox) sandboxHTTPServer(ctx context.Context, id string) error {
	out, err := f.c.ExecCollect(ctx, id, client.ExecRequest{Cmd: portsFiles})
	if err != nil || out.ExitCode != 0 {
		return fmt.Errorf("write the files in the sandbox: %v %v", err, out)
	}
	if _, err := f.c.ExecBackground(ctx, id, client.ExecRequest{
		Cmd: "cd /tmp/www && exec python3 -m http.server -b 127.0.0.1 " + strconv.Itoa(portsServerPort)}); err != nil {
		return fmt.Errorf("start the server in the sandbox: %w", err)
	}
	return waitFor(ctx, func() error {
		_, err := timedGet(func() (*http.Response, error) { return f.c.PortGet(ctx, id, portsServerPort, "/small.txt") })
		return err
	})
}

// hostHTTPServer starts python3's http.server on the host's loopback
// serving the same files, and returns its URL and how to stop it.
func hostHTTPServer(ctx context.Context) (string, func(), error) {
	dir, err := os.MkdirTemp("", "forkbox-bench-ports-")
	if err != nil {
		return "", nil, err
	}
	fail := func(err error) (string, func(), error) {
		os.RemoveAll(dir)
		return "", nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "small.txt"), []byte("a small file to fetch\n"), 0o644); err != nil {
		return fail(err)
	}
	big, err := os.Create(filepath.Join(dir, "big.bin"))
	if err != nil {
		return fail(err)
	}
	rnd, err := os.Open("/dev/urandom")
	if err == nil {
		_, err = io.CopyN(big, rnd, portsDownloadBytes)
		rnd.Close()
	}
	if cerr := big.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fail(err)
	}
	p, err := freeport.Loopback()
	if err != nil {
		return fail(err)
	}
	port := strconv.Itoa(p)
	cmd := exec.Command("python3", "-m", "http.server", "-b", "127.0.0.1", port)
	cmd.Dir = dir
	if err := cmd.Start(); err != nil {
		return fail(fmt.Errorf("start python3 -m http.server on the host: %w", err))
	}
	stop := func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		os.RemoveAll(dir)
	}
	url := "http://127.0.0.1:" + port
	err = waitFor(ctx, func() error {
		_, err := timedGet(func() (*http.Response, error) { return http.Get(url + "/small.txt") })
		return err
	})
	if err != nil {
		stop()
		return "", nil, err
	}
	return url, stop, nil
}

// waitFor calls try every 50 ms until it succeeds, for at most 30 s.
func waitFor(ctx context.Context, try func() error) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		err := try()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(errors.New("the server did not answer in 30 s"), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
