package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

func newHostCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "host",
		Short: "Drain a host of the fleet or make it ready again (admin key)",
	}
	var wait time.Duration
	var migrate bool
	drain := &cobra.Command{
		Use:   "drain ID",
		Short: "Stop placing sessions on host ID; its sessions run on until they end",
		Long: `Set host ID's drain flag (any host's API takes it; the flag is in the fleet's
state, so it holds over restarts of that host): no new session is placed
there, the host lists as "draining" in 'forkbox hosts', and its sessions run
on until they end or are destroyed. With --wait the command then waits, at
most that long, until the host has no sessions left, printing how many are
left as that changes. With --migrate it then moves each session the key
lists on host ID to another host (as 'forkbox migrate' does: each gets a
new id), one at a time, printing old and new id. 'forkbox host undrain ID'
clears the flag.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			h, err := c.DrainHost(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json && wait == 0 && !migrate {
				return printJSON(cmd.OutOrStdout(), h)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "host %s: %s, %d sessions left\n", h.ID, h.State, h.Sessions)
			if migrate {
				if err := migrateOff(cmd, c, w, h.ID); err != nil {
					return err
				}
			}
			if wait <= 0 {
				return nil
			}
			return waitDrained(cmd, c, w, h.ID, h.Sessions, wait)
		},
	}
	drain.Flags().BoolVar(&migrate, "migrate", false, "move the host's sessions (those the key lists) to other hosts")
	drain.Flags().DurationVar(&wait, "wait", 0, "wait this long (e.g. 10m) for the host's sessions to end (0: do not wait)")
	undrain := &cobra.Command{
		Use:   "undrain ID",
		Short: "Clear host ID's drain flag: it takes sessions again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			h, err := c.UndrainHost(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), h)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "host %s: %s\n", h.ID, h.State)
			return nil
		},
	}
	cmd.AddCommand(drain, undrain)
	return cmd
}

// waitDrained polls the registry until host id lists no sessions, for
// at most wait, printing the count when it changes. A host lost
// meanwhile ends the wait with an error (its sessions are terminated by
// the fleet, not drained).
func waitDrained(cmd *cobra.Command, c *client.Client, w io.Writer, id string, left int, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for left > 0 {
		if time.Now().After(deadline) {
			return errdefs.Newf(errdefs.ErrUnavailable, "host %s still has %d sessions after %v", id, left, wait)
		}
		select {
		case <-cmd.Context().Done():
			return cmd.Context().Err()
		case <-time.After(2 * time.Second):
		}
		list, err := c.Hosts(cmd.Context())
		if err != nil {
			return err
		}
		found := false
		for _, h := range list.Hosts {
			if h.ID != id {
				continue
			}
			found = true
			if h.State == "lost" {
				return errdefs.Newf(errdefs.ErrUnavailable, "host %s was lost while draining", id)
			}
			if h.Sessions != left {
				left = h.Sessions
				fmt.Fprintf(w, "host %s: %s, %d sessions left\n", id, h.State, left)
			}
		}
		if !found {
			return errdefs.Newf(errdefs.ErrNotFound, "host %s left the fleet's registry", id)
		}
	}
	fmt.Fprintf(w, "host %s: drained\n", id)
	return nil
}

// migrateOff migrates, one at a time, every running or paused session
// of the fleet's list (the key's) that is on host id. A session that
// cannot move stays where it was and is reported on stderr; the others
// still move, and the error joins the failures.
func migrateOff(cmd *cobra.Command, c *client.Client, w io.Writer, id string) error {
	list, err := c.ListSessions(cmd.Context(), client.ListOptions{})
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range list {
		// Only running and paused sessions can move; one being created
		// or ended is left to finish.
		if s.Host != id || s.State != "running" && s.State != "paused" {
			continue
		}
		moved, err := c.Migrate(cmd.Context(), s.ID, "")
		if err != nil {
			if cmd.Context().Err() != nil {
				return cmd.Context().Err()
			}
			// One that cannot move stays where it is; the others still go.
			fmt.Fprintf(cmd.ErrOrStderr(), "%s not migrated: %v\n", s.ID, err)
			errs = append(errs, forItem(s.ID, err))
			continue
		}
		fmt.Fprintf(w, "%s migrated: now %s\n", s.ID, moved.ID)
	}
	return errors.Join(errs...)
}
