package main

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

// parseForward reads "LOCAL:REMOTE" or "REMOTE" (LOCAL then the same
// number; LOCAL 0 picks a free port) into port numbers.
func parseForward(s string) (local, remote int, err error) {
	l, r, found := strings.Cut(s, ":")
	if !found {
		l, r = s, s
	}
	local, err = strconv.Atoi(l)
	if err != nil || local < 0 || local > 65535 {
		return 0, 0, fmt.Errorf("local port %q: must be a number from 0 to 65535", l)
	}
	remote, err = strconv.Atoi(r)
	if err != nil || remote < 1 || remote > 65535 {
		return 0, 0, fmt.Errorf("sandbox port %q: must be a number from 1 to 65535", r)
	}
	return local, remote, nil
}

func newPortForwardCmd(g *globals) *cobra.Command {
	var address string
	cmd := &cobra.Command{
		Use:   "port-forward ID [LOCAL:]REMOTE",
		Short: "Forward a local TCP port to a port inside a sandbox, through the daemon",
		Long: `Listens on ADDRESS:LOCAL (127.0.0.1 by default) and tunnels every connection
to port REMOTE inside the sandbox, through the daemon: the sandbox's agent makes
the connection on the sandbox's own loopback, so it also works for sandboxes
without network egress. Any TCP protocol passes. Runs until interrupted.`,
		Example: `  forkbox port-forward abc123 8000:3000   # localhost:8000 -> port 3000 in abc123
  forkbox port-forward abc123 5432         # the same port number on both sides`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			local, remote, err := parseForward(args[1])
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			l, err := net.Listen("tcp", net.JoinHostPort(address, strconv.Itoa(local)))
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "Forwarding %s -> %s:%d\n", l.Addr(), args[0], remote)
			return c.PortForward(cmd.Context(), args[0], l, remote, func(err error) {
				fmt.Fprintf(cmd.ErrOrStderr(), "forkbox: connection to %s:%d: %v\n", args[0], remote, err)
			})
		},
	}
	cmd.Flags().StringVar(&address, "address", "127.0.0.1", "local address to listen on")
	return cmd
}
