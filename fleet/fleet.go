// Package fleet is forkbox's state shared between hosts, on NATS with
// JetStream (github.com/nats-io/nats-server/v2 embedded in the daemon,
// github.com/nats-io/nats.go and its jetstream package as the client):
// no consensus or gossip of forkbox's own.
//
// One host alone (Options zero) embeds a NATS server with JetStream that
// listens on no TCP port: the daemon reaches it through an in-process
// connection only (server option DontListen, nats.InProcessServer), its
// store under the data directory. In cluster mode each host embeds one
// node of a JetStream cluster whose routes listen on Options.Listen and
// are authenticated with a shared secret (its client port, which the
// server needs before it starts routes, is on the loopback at a random
// port and takes only a token made for that run); or Options.URL names
// an existing NATS (with JetStream) to use instead.
//
// On top of the connection (Fleet): the host registry (Registry: each
// host's record and heartbeat in a KV bucket; hosts.go), and the object
// store of sealed snapshots (Objects, JetStream's object store; objects.go)
// with a bounded local cache of pulled ones (Cache; cache.go).
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/forkbox/forkbox/errdefs"
)

// routeUser is the user name every node's routes authenticate as; the
// password is the fleet secret.
const routeUser = "forkbox-fleet"

// startTimeout bounds how long Start waits for the embedded server to
// accept connections.
const startTimeout = 10 * time.Second

// Fleet is this host's connection to the fleet's NATS: the embedded
// server when there is one, the client connection and its JetStream
// context. It is safe for concurrent use. Close it when done.
type Fleet struct {
	opts Options
	srv  *server.Server // nil with Options.URL
	nc   *nats.Conn
	js   jetstream.JetStream
	// replicas is the replica count of the fleet's buckets.
	replicas int
	log      *slog.Logger
	close    sync.Once
}

// Start connects this host to the fleet per opts: it starts the embedded
// server (and waits until it accepts connections, at most 10 s) or dials
// Options.URL, then opens the JetStream context. A bad option is
// ErrInvalidArgument naming its flag; a server that cannot start (its
// route port taken, say) or a URL that does not answer is an error naming
// it. log may be nil.
func Start(ctx context.Context, opts Options, log *slog.Logger) (*Fleet, error) {
	if log == nil {
		log = slog.Default()
	}
	opts, err := opts.check()
	if err != nil {
		return nil, err
	}
	f := &Fleet{opts: opts, log: log}
	if opts.URL != "" {
		f.nc, err = nats.Connect(opts.URL, nats.Name("forkbox "+opts.NodeID), nats.MaxReconnects(-1),
			nats.Timeout(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("%w: --nats: %v", errdefs.ErrUnavailable, err)
		}
	} else {
		token := randHex(32)
		if f.srv, err = startServer(opts, token, log); err != nil {
			return nil, err
		}
		copts := []nats.Option{nats.InProcessServer(f.srv), nats.Name("forkbox " + opts.NodeID), nats.MaxReconnects(-1)}
		if opts.Cluster != "" {
			copts = append(copts, nats.Token(token))
		}
		f.nc, err = nats.Connect("", copts...)
		if err != nil {
			f.srv.Shutdown()
			return nil, fmt.Errorf("fleet: in-process connection: %w", err)
		}
	}
	f.js, err = jetstream.New(f.nc)
	if err != nil {
		f.Close()
		return nil, err
	}
	f.replicas = opts.Replicas
	if f.replicas == 0 {
		f.replicas = 1
		if opts.Cluster != "" || (opts.URL != "" && f.nc.ConnectedClusterName() != "") {
			f.replicas = 3
		}
	}
	return f, nil
}

// startServer starts the embedded NATS server of opts (checked) and
// returns it once it accepts connections; in cluster mode its client
// port takes clientToken only.
func startServer(opts Options, clientToken string, log *slog.Logger) (*server.Server, error) {
	if err := os.MkdirAll(opts.StoreDir, 0o700); err != nil {
		return nil, err
	}
	so := &server.Options{
		ServerName: opts.NodeID,
		DontListen: true,
		JetStream:  true,
		StoreDir:   opts.StoreDir,
		// Fleet state is small and lives on disk; memory streams are
		// not used.
		JetStreamMaxMemory: 64 << 20,
		NoSigs:             true,
		// No HTTP monitoring port, no leaf nodes, no gateways.
	}
	if opts.Cluster != "" {
		// The server starts its routes only once its client listener is
		// up (nats-server's StartRouting waits for it), so a cluster
		// node cannot be DontListen: its client port is on the loopback,
		// picked at random, and takes only a token made for this run,
		// which the in-process connection presents.
		so.DontListen = false
		so.Host, so.Port = "127.0.0.1", server.RANDOM_PORT
		so.Authorization = clientToken
		host, port, _ := splitHostPort(opts.Listen)
		so.Cluster = server.ClusterOpts{
			Name: opts.Cluster, Host: host, Port: port,
			Username: routeUser, Password: opts.Secret, AuthTimeout: 2,
			// The routes carry the address each node was given; no node
			// learns or advertises others' (the peers are configured).
			NoAdvertise: true,
		}
		for _, p := range opts.Peers {
			so.Routes = append(so.Routes, &url.URL{Scheme: "nats-route", User: url.UserPassword(routeUser, opts.Secret), Host: p.Addr})
		}
	}
	srv, err := server.NewServer(so)
	if err != nil {
		return nil, fmt.Errorf("fleet: embedded NATS server: %w", err)
	}
	lg := &serverLog{log: log.With("component", "nats", "node", opts.NodeID)}
	srv.SetLoggerV2(lg, false, false, false)
	srv.Start()
	// Ready, or failed: the server logs a fatal error (a route port
	// taken) instead of returning it, and is then never ready.
	deadline := time.Now().Add(startTimeout)
	for {
		if err := lg.fatal.Load(); err != nil {
			srv.Shutdown()
			return nil, fmt.Errorf("fleet: embedded NATS server: %v", *err)
		}
		if srv.ReadyForConnections(50 * time.Millisecond) {
			break
		}
		if time.Now().After(deadline) {
			srv.Shutdown()
			return nil, fmt.Errorf("fleet: embedded NATS server not ready after %v", startTimeout)
		}
	}
	if err := lg.fatal.Load(); err != nil {
		srv.Shutdown()
		return nil, fmt.Errorf("fleet: embedded NATS server: %v", *err)
	}
	return srv, nil
}

func splitHostPort(addr string) (string, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	p, err := strconv.Atoi(port)
	return host, p, err
}

// NodeID is this host's id in the fleet.
func (f *Fleet) NodeID() string { return f.opts.NodeID }

// Replicas is the replica count of the fleet's buckets (1 alone, 3 in a
// cluster).
func (f *Fleet) Replicas() int { return f.replicas }

// Clustered reports whether this host is part of a cluster (embedded or
// by URL) rather than alone.
func (f *Fleet) Clustered() bool { return f.replicas > 1 }

// JetStream is the client's JetStream context (for the fleet's own
// packages and tests).
func (f *Fleet) JetStream() jetstream.JetStream { return f.js }

// RouteAddr is the address the embedded server accepts routes on ("" when
// it has no route listener: alone or with a URL). With a Listen port of
// 0 it names the port picked.
func (f *Fleet) RouteAddr() string {
	if f.srv == nil {
		return ""
	}
	if a := f.srv.ClusterAddr(); a != nil {
		return a.String()
	}
	return ""
}

// ConnectedPeers is how many other nodes the embedded server has routes
// to (0 alone or with a URL).
func (f *Fleet) ConnectedPeers() int {
	if f.srv == nil {
		return 0
	}
	return f.srv.NumRemotes()
}

// Close drains nothing: it closes the client connection and shuts the
// embedded server down (its store stays on disk). Safe to call more than
// once.
func (f *Fleet) Close() {
	f.close.Do(func() {
		if f.nc != nil {
			f.nc.Close()
		}
		if f.srv != nil {
			f.srv.Shutdown()
			f.srv.WaitForShutdown()
		}
	})
}

// retry calls op until it succeeds, ctx ends, or op fails with an error
// other than JetStream not being ready yet (a cluster electing its meta
// leader, a stream its leader). It returns op's last error.
func retry(ctx context.Context, op func(context.Context) error) error {
	delay := 20 * time.Millisecond
	for {
		// Each attempt has a few seconds: a request the cluster drops
		// while it elects a leader is asked again.
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := op(actx)
		cancel()
		if err == nil || !transient(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: fleet: %v (%v)", errdefs.ErrUnavailable, err, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, 500*time.Millisecond)
	}
}

// transient reports whether err is JetStream being temporarily unable to
// answer (no meta leader, no stream leader, a timeout, no responders).
func transient(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		// The server's codes: 10005 no suitable peers for placement (the
		// cluster still forming), 10008 JetStream temporarily
		// unavailable, 10009 the cluster cannot handle the request (no
		// leader yet).
		switch apiErr.ErrorCode {
		case 10005, 10008, 10009:
			return true
		}
		return apiErr.Code == 503
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, nats.ErrJetStreamNotEnabled)
}

// serverLog gives the embedded server's log lines to slog (notices and
// debug at debug level: the server is chatty) and keeps the first fatal
// error, which the server logs instead of returning.
type serverLog struct {
	log   *slog.Logger
	fatal atomic.Pointer[string]
}

func (l *serverLog) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *serverLog) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *serverLog) Errorf(format string, v ...any)  { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l *serverLog) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l *serverLog) Tracef(format string, v ...any)  {}
func (l *serverLog) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.fatal.CompareAndSwap(nil, &msg)
	l.log.Error(msg)
}
