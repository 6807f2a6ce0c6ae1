package runsc

import (
	"os"

	gorunc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/forkbox/forkbox/runtime/bundle"
)

// A sandbox with a network (Config.NetnsPath) runs on gVisor's own network
// stack (runsc --network=sandbox, netstack in the Sentry), not on the host
// kernel's (--network=host): the Sentry takes the namespace's interface,
// addresses and routes at start and sends and receives raw frames on it, so
// the sandbox's TCP/IP is served in user space like every other system
// call, and a memory snapshot saves the stack (gVisor cannot save host
// sockets). What it sends leaves by the namespace's link to the host, where
// the daemon's host table (netpolicy) redirects it to the egress service
// and drops the rest: the rules inside the namespace, which the runc tier's
// kernel stack passes through, are not on netstack's path. At a restore
// netstack takes the new namespace's addresses, so a fork of a networked
// sandbox has its own link and address; connections open at the snapshot
// do not survive it (their peer is the egress service, which has no record
// of them in the new sandbox).
const (
	networkNone    = "--network=none"
	networkSandbox = "--network=sandbox"
)

// runner returns the go-runc handle for a sandbox with a network
// (networked) or without.
func (d *Driver) runner(networked bool) *gorunc.Runc {
	if networked {
		return d.runscNet
	}
	return d.runsc
}

// networked reports whether sandbox id was started in a network namespace
// of its own: its recorded bundle's spec joins one by path. False when the
// bundle cannot be read (runsc then reports the sandbox's own error).
func (d *Driver) networked(id string) bool {
	dir, err := os.Readlink(d.bundleRecord(id))
	if err != nil {
		return false
	}
	spec, err := bundle.ReadSpec(dir)
	if err != nil {
		return false
	}
	return joinsNetwork(spec)
}

// joinsNetwork reports whether spec joins a network namespace by path.
func joinsNetwork(spec *specs.Spec) bool {
	if spec == nil || spec.Linux == nil {
		return false
	}
	for _, ns := range spec.Linux.Namespaces {
		if ns.Type == specs.NetworkNamespace && ns.Path != "" {
			return true
		}
	}
	return false
}
