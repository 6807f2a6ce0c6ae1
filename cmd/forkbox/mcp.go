package main

import (
	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/mcp"
)

// newMCPCmd is forkbox mcp: an MCP server (package mcp) on standard input
// and output, for MCP clients that start their servers as commands.
func newMCPCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "mcp",
		Short: "Serve forkbox's tools to an MCP client over standard input and output",
		Long: `Serve forkbox as a Model Context Protocol server on standard input and output
(newline-delimited JSON-RPC), for MCP clients that start their servers as
commands (Claude Code, Cursor, agent frameworks). Its tools create sandboxes,
run commands and code in them, read and write their files, snapshot, fork,
pause, resume and destroy them. It reaches the daemon as every command does:
FORKBOX_URL and FORKBOX_API_KEY (or the key file, on the daemon's host).

The daemon also serves MCP over streamable HTTP at /mcp, with the API key as
"Authorization: Bearer KEY".`,
		Example: `  claude mcp add forkbox -- forkbox mcp
  FORKBOX_URL=http://sandbox-host:7070 FORKBOX_API_KEY=KEY forkbox mcp`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return mcp.ServeStdio(cmd.Context(), c, cmd.InOrStdin(), cmd.OutOrStdout())
		},
	}
}
