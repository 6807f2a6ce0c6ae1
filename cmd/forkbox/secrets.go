package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

// maxSecretInput is the most bytes secret set reads from stdin (one more
// than the daemon takes, so that it can say the value is too long).
const maxSecretInput = 64<<10 + 1

func newSecretCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Manage the tenant's secrets (the credential broker: values never enter a sandbox)",
	}
	var hosts []string
	var header string
	set := &cobra.Command{
		Use:   "set NAME --host HOST [--host HOST...] [--header 'Name: ... {value}'] < VALUE",
		Short: "Set a secret from stdin (one trailing newline is dropped)",
		Long: "Set a secret from stdin (one trailing newline is dropped). A session created with --secret NAME\n" +
			"has a placeholder in the variable NAME upper-cased; the egress proxy puts the value in its place\n" +
			"in requests over TLS to the secret's hosts (or sets --header on each), and nowhere else.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			value, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), maxSecretInput))
			if err != nil {
				return fmt.Errorf("read the value from stdin: %w", err)
			}
			value = bytes.TrimSuffix(value, []byte("\n"))
			value = bytes.TrimSuffix(value, []byte("\r"))
			s, created, err := c.SetSecret(cmd.Context(), args[0], hosts, header, value)
			if err != nil {
				return forItem(args[0], err)
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), s)
			}
			verb := "replaced"
			if created {
				verb = "created"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s %s (hosts %s)\n", s.Name, verb, strings.Join(s.Hosts, ", "))
			return nil
		},
	}
	set.Flags().StringArrayVar(&hosts, "host", nil, "a host the value may be sent to over TLS (repeatable; at least one)")
	set.Flags().StringVar(&header, "header", "", "set this header on every request to the hosts, e.g. 'Authorization: Bearer {value}'")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List the secrets: names, hosts and headers, never values",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ss, err := c.Secrets(cmd.Context())
			if err != nil {
				return err
			}
			return printList(cmd.OutOrStdout(), g.json, ss, "NAME\tHOSTS\tHEADER", func(s client.Secret) string {
				h := s.Header
				if h == "" {
					h = "-"
				}
				return fmt.Sprintf("%s\t%s\t%s", s.Name, strings.Join(s.Hosts, ","), h)
			})
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove secrets: their placeholders stop working at once",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, name := range args {
				if err := c.DeleteSecret(cmd.Context(), name); err != nil {
					return forItem(name, err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), name)
			}
			return nil
		},
	}
	cmd.AddCommand(set, ls, rm)
	return cmd
}
