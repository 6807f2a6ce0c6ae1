package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

func newHostsCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "hosts",
		Short: "List the fleet's hosts: capacity, load, version and state (admin key)",
		Long: `List every host of the fleet from its registry: its id, API address, forkbox
version, isolation tiers, capacity (memory, CPUs, session slots), sessions now
(on a draining host: how many are left), warm-pool members ready, and state:
ready; draining ('forkbox host drain': no new sessions there); or lost (no
heartbeat for longer than the daemon's --host-lost-after: its sessions are
terminated with reason host-lost, its pool members forgotten, and when it
comes back it destroys those sessions before it rejoins). A host marked "no"
under PLACE is listed but not chosen for sessions: it is not ready, or it runs
another forkbox version (another major.minor release, or another non-release
build). One host alone lists itself, "local" unless serve was given --node-id.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			list, err := c.Hosts(cmd.Context())
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), list)
			}
			return printHosts(cmd.OutOrStdout(), list, time.Now())
		},
	}
}

// printHosts writes list as a table, the answering host marked with '*'.
func printHosts(w io.Writer, list *client.HostList, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tPLACE\tSESSIONS\tPOOLED\tSLOTS\tMEMORY\tCPUS\tTIERS\tVERSION\tHEARTBEAT\tAPI")
	for _, h := range list.Hosts {
		id := h.ID
		if id == list.Self {
			id += " *"
		}
		place := "no"
		if h.Placeable {
			place = "yes"
		}
		state := h.State
		if state == "draining" {
			state = fmt.Sprintf("draining (%d left)", h.Sessions)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d MiB\t%d\t%s\t%s\t%s ago\t%s\n", id, state, place, h.Sessions, h.Pooled, h.SessionSlots,
			h.MemoryMB, h.CPUs, strings.Join(h.Tiers, ","), h.Version, now.Sub(h.Heartbeat).Round(100*time.Millisecond), h.API)
	}
	return tw.Flush()
}
