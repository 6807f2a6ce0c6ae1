package main

import (
	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/bench"
	"github.com/forkbox/forkbox/client"
)

// newBenchCmd returns `forkbox bench`, a thin wrapper over package bench:
// it maps flags to bench.Options and prints the report.
func newBenchCmd(g *globals) *cobra.Command {
	var opts bench.Options
	var storageGiB int64
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Benchmark forkbox beside the runc and runsc CLIs and podman (as root)",
		Long: `Measure forkbox through its REST API (create, exec true, destroy, a whole
create + exec + destroy run, pause, resume, a snapshot of a session that wrote
500 MB, a fork of 8 sessions from that snapshot, a snapshot right after
writing 300 MB without sync with how long it froze the sandbox (and the
freeze after a sync), and a create from a warm pool)
and, in the same run, the raw runc CLI and podman on a busybox root filesystem
(run to completion, exec, pause, resume, podman commit after writing 500 MB),
and a plain copy of 500 MB for reference. Prints p50/p99/mean in milliseconds,
each peer's p50 relative to forkbox's, and the targets of the design notes.

By default forkbox is a private daemon started in-process on a temporary data
directory and removed at the end (--storage picks its storage driver); --url
(or FORKBOX_URL) measures a running daemon instead. Against a running daemon
the benchmark sets the base template's warm pool for a while and puts it back
as it was at the end.`,
		Example: `  forkbox bench -n 20
  forkbox bench --skip-peers --json
  FORKBOX_URL=http://127.0.0.1:7070 forkbox bench`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.StorageImageBytes = storageGiB << 30
			opts.APIKeyFile = g.keyFile
			opts.Progress = cmd.ErrOrStderr()
			rep, err := bench.Run(cmd.Context(), opts)
			if rep != nil {
				write := rep.WriteTable
				if g.json {
					write = rep.WriteJSON
				}
				if werr := write(cmd.OutOrStdout()); werr != nil {
					return werr
				}
			}
			if err != nil {
				return err
			}
			return rep.ForkboxErr()
		},
	}
	f := cmd.Flags()
	f.IntVarP(&opts.N, "iterations", "n", bench.DefaultN, "measured iterations per operation (after 2 warm-ups)")
	f.BoolVar(&opts.SkipPeers, "skip-peers", false, "measure forkbox only (not runc and podman)")
	f.StringVar(&opts.URL, "url", "", "measure the daemon at this URL (default "+client.EnvURL+"; unset: a private daemon)")
	f.StringVar(&opts.APIKey, "api-key", "", "API key of the daemon at --url (default "+client.EnvAPIKey+", then --api-key-file)")
	f.StringVar(&opts.AgentPath, "agent", "", "forkbox-agent binary of the private daemon (default: beside forkbox, then PATH)")
	f.StringVar(&opts.DataDir, "data-dir", "", "data directory of the private daemon, kept afterwards (default: a temporary one)")
	f.StringVar(&opts.Storage, "storage", "", "storage driver of the private daemon: btrfs or overlay (default: btrfs where it works)")
	f.Int64Var(&storageGiB, "storage-size", 0, "size in GiB of the private daemon's storage image (default: half the free disk, at most 64)")
	return cmd
}
