package cli

import (
	"github.com/spf13/cobra"
)

func newBenchCmd(g *globals) *cobra.Command {
	return &cobra.Command{Use: "bench", Short: "Benchmark (pending)", RunE: func(cmd *cobra.Command, args []string) error { return nil }}
}
