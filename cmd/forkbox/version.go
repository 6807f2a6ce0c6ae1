package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/internal/version"
)

func newVersionCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the client's and the daemon's versions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			out := map[string]string{"client": version.String(), "envd": version.EnvdVersion}
			if c, err := g.client(); err == nil {
				ctx, cancel := context.WithTimeout(cmd.Context(), 3*time.Second)
				defer cancel()
				if info, err := c.Info(ctx); err == nil {
					out["daemon"] = info.Version
					out["driver"] = info.DefaultDriver
				}
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), out)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "forkbox %s (envd protocol %s)\n", out["client"], out["envd"])
			if d, ok := out["daemon"]; ok {
				fmt.Fprintf(cmd.OutOrStdout(), "daemon  %s (driver %s)\n", d, out["driver"])
			}
			return nil
		},
	}
}
