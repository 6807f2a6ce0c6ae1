package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

func newKeyCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "key",
		Short: "Manage API keys (admin key)",
		Long:  "Create, list and revoke API keys. Each key belongs to one tenant. These commands need an admin key.",
	}
	var tenant, name string
	var admin bool
	create := &cobra.Command{
		Use:   "create --tenant NAME [flags]",
		Short: "Create an API key and print its secret (shown this once)",
		Long: `Create an API key for a tenant and print its secret alone on stdout (with --json
the whole key). The secret is shown this once: only its hash is stored.`,
		Example: `  FORKBOX_API_KEY=$(forkbox key create --tenant acme --name ci)`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			k, err := c.CreateKey(cmd.Context(), tenant, name, admin)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "forkbox: key %s created; its secret is shown only this once, store it now\n", k.ID)
			if g.json {
				return printJSON(cmd.OutOrStdout(), k)
			}
			fmt.Fprintln(cmd.OutOrStdout(), k.Secret)
			return nil
		},
	}
	create.Flags().StringVar(&tenant, "tenant", "", "the tenant the key belongs to (required)")
	create.Flags().StringVar(&name, "name", "", "a name for the key, to tell keys apart")
	create.Flags().BoolVar(&admin, "admin", false, "make an admin key: it manages tenants and keys and reads every tenant's audit records")
	_ = create.MarkFlagRequired("tenant")
	var lsTenant string
	ls := &cobra.Command{
		Use:   "ls [flags]",
		Short: "List API keys (never their secrets), revoked ones included",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			keys, err := c.Keys(cmd.Context(), lsTenant)
			if err != nil {
				return err
			}
			return printList(cmd.OutOrStdout(), g.json, keys, "ID\tTENANT\tNAME\tADMIN\tCREATED\tLAST USED\tREVOKED",
				func(k client.APIKey) string {
					name, admin := k.Name, "no"
					if name == "" {
						name = "-"
					}
					if k.Admin {
						admin = "yes"
					}
					return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", k.ID, k.Tenant, name, admin,
						ago(&k.CreatedAt), ago(k.LastUsedAt), ago(k.RevokedAt))
				})
		},
	}
	ls.Flags().StringVar(&lsTenant, "tenant", "", "list only this tenant's keys")
	revoke := &cobra.Command{
		Use:   "revoke ID...",
		Short: "Revoke API keys; they stop working at once",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, id := range args {
				if err := c.RevokeKey(cmd.Context(), id); err != nil {
					return forItem(id, err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
			}
			return nil
		},
	}
	cmd.AddCommand(create, ls, revoke)
	return cmd
}
