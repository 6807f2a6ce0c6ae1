package fleet

import (
	"fmt"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
)

// Options configure a fleet connection (Start). The zero value (plus
// StoreDir) is one host alone: an embedded NATS server with JetStream
// that listens on no port, reached in-process only.
type Options struct {
	// StoreDir is the embedded server's JetStream store directory
	// (datadir.Layout.FleetStore); made 0700 when missing. Unused with URL.
	StoreDir string
	// Cluster names the JetStream cluster this host's embedded server
	// joins ("" alone). With it NodeID, Listen, Peers and Secret are
	// required.
	Cluster string
	// NodeID is this host's id in the fleet: its NATS server name and its
	// key in the host registry (ValidID). "" alone: "local".
	NodeID string
	// Listen is the HOST:PORT the embedded server accepts routes from
	// the other nodes on (cluster mode only; port 0 picks one).
	Listen string
	// Peers are the other nodes of the cluster (ParsePeers).
	Peers []Peer
	// Secret authenticates the routes between the nodes: every node
	// must have the same one (ReadSecret); a route without it is refused.
	Secret string
	// URL, when set, is an existing NATS server or cluster (with
	// JetStream) to use instead of an embedded server
	// ("nats://user:pass@host:4222"; comma-separated for several).
	URL string
	// Replicas is the replica count of the fleet's buckets; 0 picks 3 in
	// cluster mode (and with a URL whose server is clustered), else 1.
	Replicas int
}

// Peer is another node of the cluster: its id (as its --node-id) and the
// HOST:PORT it accepts routes on (its --fleet-listen).
type Peer struct {
	ID   string
	Addr string
}

// idPattern is what a host id may be: it is a NATS server name and a
// JetStream KV key, and shows in tables.
var idPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidID returns nil when id can name a host (1-63 of a-z, 0-9 and '-',
// not starting or ending with '-'), else ErrInvalidArgument naming field.
func ValidID(field, id string) error {
	if !idPattern.MatchString(id) {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "%s %q: want 1-63 characters of a-z, 0-9 and '-', not starting or ending with '-'", field, id)
	}
	return nil
}

// ParsePeers parses "ID=HOST:PORT,ID=HOST:PORT" (the --peers flag) into
// peers. An empty s is none. A malformed entry, a bad id, an address
// without a port or a repeated id is ErrInvalidArgument naming "--peers".
func ParsePeers(s string) ([]Peer, error) {
	var out []Peer
	seen := map[string]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, addr, ok := strings.Cut(part, "=")
		if !ok {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "--peers %q: want ID=HOST:PORT", part)
		}
		if err := ValidID("--peers id", id); err != nil {
			return nil, err
		}
		if err := validAddr("--peers "+id, addr, false); err != nil {
			return nil, err
		}
		if seen[id] {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "--peers: %q named twice", id)
		}
		seen[id] = true
		out = append(out, Peer{ID: id, Addr: addr})
	}
	return out, nil
}

// validAddr checks that addr is HOST:PORT with a port in 1-65535 (0 too
// when zeroOK), else ErrInvalidArgument naming field.
func validAddr(field, addr string, zeroOK bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "%s %q: want HOST:PORT", field, addr)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 || (p == 0 && !zeroOK) {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "%s %q: port out of range", field, addr)
	}
	return nil
}

// MinSecretBytes is the shortest fleet secret ReadSecret accepts.
const MinSecretBytes = 32

// ReadSecret reads the fleet secret from the file at path (its content,
// surrounding white space removed). The file must be a regular file that
// neither its group nor others can read or write (mode 0600 or
// stricter), and the secret at least MinSecretBytes long and without
// white space inside; otherwise ErrInvalidArgument naming the file. Make
// one with `head -c 32 /dev/urandom | base64 > FILE; chmod 600 FILE` and
// copy it to every host.
func ReadSecret(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("--fleet-secret-file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "--fleet-secret-file %s: not a regular file", path)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "--fleet-secret-file %s: mode %v lets others read it; chmod 600 it", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if len(s) < MinSecretBytes {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "--fleet-secret-file %s: the secret has %d bytes, want at least %d", path, len(s), MinSecretBytes)
	}
	if strings.ContainsAny(s, " \t\r\n") {
		return "", errdefs.Newf(errdefs.ErrInvalidArgument, "--fleet-secret-file %s: the secret holds white space", path)
	}
	return s, nil
}

// check validates o for Start and returns it with defaults applied.
func (o Options) check() (Options, error) {
	if o.URL != "" {
		if o.Cluster != "" {
			return o, errdefs.Newf(errdefs.ErrInvalidArgument, "--nats and --cluster: choose one (--nats uses an existing NATS, --cluster embeds a node of one)")
		}
		if o.NodeID == "" {
			return o, errdefs.Newf(errdefs.ErrInvalidArgument, "--node-id: required with --nats (each host needs its own id)")
		}
		return o, ValidID("--node-id", o.NodeID)
	}
	if o.StoreDir == "" {
		return o, errdefs.Newf(errdefs.ErrInvalidArgument, "fleet: no JetStream store directory")
	}
	if o.Cluster == "" {
		if len(o.Peers) > 0 || o.Listen != "" || o.Secret != "" {
			return o, errdefs.Newf(errdefs.ErrInvalidArgument, "--peers, --fleet-listen and --fleet-secret-file need --cluster")
		}
		if o.NodeID == "" {
			o.NodeID = "local"
		}
		return o, ValidID("--node-id", o.NodeID)
	}
	if err := ValidID("--cluster", o.Cluster); err != nil {
		return o, err
	}
	if o.NodeID == "" {
		return o, errdefs.Newf(errdefs.ErrInvalidArgument, "--node-id: required with --cluster")
	}
	if err := ValidID("--node-id", o.NodeID); err != nil {
		return o, err
	}
	if o.Listen == "" {
		return o, errdefs.Newf(errdefs.ErrInvalidArgument, "--fleet-listen: required with --cluster (HOST:PORT the other nodes reach this one on)")
	}
	if err := validAddr("--fleet-listen", o.Listen, true); err != nil {
		return o, err
	}
	if len(o.Peers) == 0 {
		return o, errdefs.Newf(errdefs.ErrInvalidArgument, "--peers: required with --cluster (ID=HOST:PORT of the other nodes)")
	}
	for _, p := range o.Peers {
		if p.ID == o.NodeID {
			return o, errdefs.Newf(errdefs.ErrInvalidArgument, "--peers: %q is this node's own --node-id", p.ID)
		}
	}
	if len(o.Secret) < MinSecretBytes {
		return o, errdefs.Newf(errdefs.ErrInvalidArgument, "--fleet-secret-file: required with --cluster (the routes between the nodes are authenticated with it)")
	}
	return o, nil
}
