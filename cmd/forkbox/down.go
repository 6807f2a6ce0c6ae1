package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/daemon"
	"github.com/forkbox/forkbox/defaults"
)

func newDownCmd() *cobra.Command {
	var opts daemon.DownOptions
	var level string
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Destroy every sandbox of a data directory and release the host (as root, no daemon running)",
		Long: `Take down what forkbox serve left on the host for a data directory, while no
daemon runs on it: every sandbox is destroyed (sessions end with reason
"deleted"; warm-pool members go too), their network namespaces and host links
are removed, the daemon's nftables table and cgroup parent go, the storage
volume is unmounted and its loop device detached. The data directory (database,
templates, snapshots, keys) stays: a later serve starts from it, and deleting
it uninstalls forkbox for good.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			log, err := stderrLogger(cmd.ErrOrStderr(), level)
			if err != nil {
				return err
			}
			opts.Log = log
			n, err := daemon.Down(cmd.Context(), opts)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %d sandboxes destroyed; nothing of it is left on the host\n", opts.DataDir, n)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.DataDir, "data-dir", defaults.DataDir, "the daemon's data directory")
	f.StringVar(&opts.RuncPath, "runc", "", "runc binary (default: from PATH)")
	f.StringVar(&opts.RunscPath, "runsc", "", "gVisor's runsc binary (default: the pinned build make deps installs, else from PATH)")
	f.StringVar(&level, "log-level", "warn", "debug, info, warn or error")
	return cmd
}
