package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

// snapshotExample and forkExample are the help's examples: shell scripts
// that run as written (e2e/cli_test.go runs them), one command a line.
const (
	snapshotExample = `  id=$(forkbox create)
  forkbox exec $id -- sh -c 'echo hello > note.txt'
  snap=$(forkbox snapshot $id)               # the session keeps running
  child=$(forkbox create --snapshot $snap)   # a new session with its files
  forkbox exec $child -- cat note.txt
  forkbox snapshot ls
  forkbox snapshot rm --force $snap          # --force: and $child, made from it
  forkbox rm $id`
	forkExample = `  id=$(forkbox create)
  forkbox exec $id -- sh -c 'echo hello > note.txt'
  forks=$(forkbox fork $id -n 3)             # snapshot $id, start 3 copies of it
  for f in $forks; do forkbox exec $f -- cat note.txt; done
  snap=$(forkbox snapshot $id)
  forkbox fork --from-snapshot $snap -n 2    # 2 sessions from that snapshot
  forkbox snapshot rm --force $snap          # --force: and the 2 forks
  forkbox rm $forks $id`
)

func newSnapshotCmd(g *globals) *cobra.Command {
	var expires time.Duration
	var memory bool
	cmd := &cobra.Command{
		Use:   "snapshot SESSION",
		Short: "Snapshot a session's files (it keeps running); ls and rm manage snapshots",
		Long: `Snapshot a session's files into a read-only snapshot that new sessions start from
(forkbox create --snapshot, forkbox fork --from-snapshot) and print its id. The
runc tier captures the filesystem only: processes and memory are not part of
the snapshot (--with-memory, in the gvisor tier, takes them too).`,
		Example: snapshotExample,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			sn, err := c.SnapshotWith(cmd.Context(), args[0],
				client.SnapshotRequest{ExpiresInS: int64(expires.Seconds()), Memory: memory})
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), sn)
			}
			fmt.Fprintln(cmd.OutOrStdout(), sn.ID)
			return nil
		},
	}
	cmd.Flags().DurationVar(&expires, "expires", 0, "delete the snapshot after this long (e.g. 24h; default: keep)")
	cmd.Flags().BoolVar(&memory, "with-memory", false, "also checkpoint processes and memory (isolation gvisor)")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List snapshots",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			snaps, err := c.Snapshots(cmd.Context())
			if err != nil {
				return err
			}
			return printList(cmd.OutOrStdout(), g.json, snaps, "ID\tSESSION\tPARENT\tTEMPLATE\tSIZE\tCREATED\tEXPIRES",
				func(sn client.Snapshot) string {
					exp := "-"
					if sn.ExpiresAt != nil {
						exp = "in " + time.Until(*sn.ExpiresAt).Round(time.Second).String()
					}
					parent := sn.Parent
					if parent == "" {
						parent = "-"
					}
					return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", sn.ID, sn.SessionID, parent, sn.Template,
						bytesText(sn.SizeBytes), ago(&sn.CreatedAt), exp)
				})
		},
	}
	var force bool
	rm := &cobra.Command{
		Use:   "rm SNAPSHOT...",
		Short: "Delete snapshots (--force also destroys sessions and snapshots built on them)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.DeleteSnapshot(cmd.Context(), id, force); err != nil {
					return forItem(id, err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
			}
			return nil
		},
	}
	rm.Flags().BoolVar(&force, "force", false, "also destroy the sessions and delete the snapshots that depend on it")
	cmd.AddCommand(ls, rm)
	return cmd
}

func newForkCmd(g *globals) *cobra.Command {
	var cf createFlags
	var n int
	var fromSnapshot, memory bool
	var run client.ForkRun
	var runTimeout time.Duration
	var keep, scoreRegex, scoreFile string
	cmd := &cobra.Command{
		Use:   "fork SESSION | --from-snapshot SNAPSHOT | SNAPSHOT --run CMD",
		Short: "Start N sessions from a session (snapshot taken on the spot) or from a snapshot",
		Long: `Start N sessions from a session (a snapshot is taken on the spot) or, with
--from-snapshot, from a snapshot, and print their ids. With --run the argument
is a snapshot: the command runs in every child at once, a line per child is
printed as it ends (exit code, score, time), and --keep says which children
stay (all, best by --score-regex or --score-file, none).`,
		Example: forkExample,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			req, err := cf.request()
			if err != nil {
				return err
			}
			freq := client.ForkRequest{Count: n, CreateRequest: req, Memory: memory}
			if run.Cmd != "" {
				run.TimeoutS = int64(runTimeout.Seconds())
				freq.Run, freq.Keep = &run, keep
				if scoreRegex != "" || scoreFile != "" {
					freq.Score = &client.ForkScore{StdoutRegex: scoreRegex, File: scoreFile}
				}
				return runForks(cmd, g, c, args[0], freq)
			}
			var res *client.ForkResult
			if fromSnapshot {
				res, err = c.ForkSnapshot(cmd.Context(), args[0], freq)
			} else {
				res, err = c.ForkSession(cmd.Context(), args[0], freq)
			}
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			for _, s := range res.Sessions {
				fmt.Fprintln(cmd.OutOrStdout(), s.ID)
			}
			return nil
		},
	}
	cmd.Flags().IntVarP(&n, "count", "n", 1, "how many sessions to start (1-64)")
	cmd.Flags().BoolVar(&fromSnapshot, "from-snapshot", false, "the argument is a snapshot id, not a session id")
	cmd.Flags().BoolVar(&memory, "with-memory", false, "snapshot processes and memory too, so the forks continue them (isolation gvisor)")
	cmd.Flags().StringVar(&run.Cmd, "run", "", "run this shell command in every child (the argument is then a snapshot)")
	cmd.Flags().DurationVar(&runTimeout, "run-timeout", 0, "bound each child's --run command (default 10m)")
	cmd.Flags().StringVar(&keep, "keep", "", "with --run: keep all (default), best or none of the children")
	cmd.Flags().StringVar(&scoreRegex, "score-regex", "", "with --run: score a child by the last number this regex matches in its stdout")
	cmd.Flags().StringVar(&scoreFile, "score-file", "", "with --run: score a child by the number in this file in it")
	cf.register(cmd)
	return cmd
}

func newPauseCmd(g *globals, resume bool) *cobra.Command {
	use, short := "pause SESSION...", "Freeze sessions (no CPU; processes and files stay; the timeout clock stops)"
	if resume {
		use, short = "resume SESSION...", "Thaw paused sessions"
	}
	return &cobra.Command{
		Use:   use,
		Short: short,
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				var s *client.Session
				if resume {
					s, err = c.Resume(cmd.Context(), id)
				} else {
					s, err = c.Pause(cmd.Context(), id)
				}
				if err != nil {
					return forItem(id, err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", s.ID, s.State)
			}
			return nil
		},
	}
}

func newPoolCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "pool", Short: "Manage warm pools of ready sandboxes"}
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List warm pools and their depth",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			pools, err := c.Pools(cmd.Context())
			if err != nil {
				return err
			}
			return printList(cmd.OutOrStdout(), g.json, pools, "TEMPLATE\tSIZE\tREADY\tSTARTING\tCPU\tMEMORY\tPIDS\tDISK",
				func(p client.Pool) string {
					return fmt.Sprintf("%s\t%d\t%d\t%d\t%g\t%dMiB\t%d\t%dMiB", p.Template, p.Size, p.Ready, p.Starting,
						p.CPU, p.MemoryMB, p.Pids, p.DiskMB)
				})
		},
	}
	var p client.Pool
	set := &cobra.Command{
		Use:   "set TEMPLATE SIZE",
		Short: "Keep SIZE ready sandboxes of TEMPLATE (0 empties the pool)",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			if _, err := fmt.Sscanf(args[1], "%d", &p.Size); err != nil {
				return fmt.Errorf("SIZE %q is not a number", args[1])
			}
			p.Template = args[0]
			got, err := c.SetPool(cmd.Context(), p)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), got)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "pool %s: size %d (ready %d)\n", got.Template, got.Size, got.Ready)
			return nil
		},
	}
	set.Flags().Float64Var(&p.CPU, "cpu", 0, "members' CPU quota in cores (default 1)")
	set.Flags().Int64Var(&p.MemoryMB, "memory", 0, "members' memory limit in MiB (default 512)")
	set.Flags().Int64Var(&p.Pids, "pids", 0, "members' task limit (default 512)")
	set.Flags().Int64Var(&p.DiskMB, "disk", 0, "members' disk limit in MiB (default 4096)")
	cmd.AddCommand(ls, set)
	return cmd
}

// bytesText prints a byte count with a binary unit.
func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func newMigrateCmd(g *globals) *cobra.Command {
	var host string
	cmd := &cobra.Command{
		Use:   "migrate SESSION",
		Short: "Move a session to another host of the fleet (it gets a new id; on runc only its files move)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			s, err := c.Migrate(cmd.Context(), args[0], host)
			if err != nil {
				return forItem(args[0], err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s\n", s.ID, s.State)
			return nil
		},
	}
	cmd.Flags().StringVar(&host, "host", "", "fleet id of the host to move to (default: the fleet picks one)")
	return cmd
}
