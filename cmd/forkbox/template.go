package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

func newTemplateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "template", Short: "Manage templates (root filesystems sandboxes start from)"}
	var ref string
	imp := &cobra.Command{
		Use:   "import NAME PATH",
		Short: "Import an OCI image (an OCI layout directory, or a docker save / OCI tarball)",
		Example: `  docker save python:3.12-slim -o py.tar && forkbox template import py312 py.tar
  skopeo copy docker://alpine:3.20 oci:alpine:3.20 && forkbox template import alpine ./alpine`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.ImportTemplatePath(cmd.Context(), args[0], ref, args[1])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "imported %s (%s, %d bytes)\n", t.Name, t.Digest, t.SizeBytes)
			return nil
		},
	}
	imp.Flags().StringVar(&ref, "ref", "", "image to pick when PATH holds several (a tag such as python:3.12)")
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List templates",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ts, err := c.Templates(cmd.Context())
			if err != nil {
				return err
			}
			return printList(cmd.OutOrStdout(), g.json, ts, "NAME\tSOURCE\tSIZE\tDIGEST\tCREATED",
				func(t client.Template) string {
					return fmt.Sprintf("%s\t%s\t%d\t%s\t%s", t.Name, t.Source, t.SizeBytes, t.Digest, t.CreatedAt)
				})
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Delete a template that no session uses",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return c.DeleteTemplate(cmd.Context(), args[0])
		},
	}
	cmd.AddCommand(imp, ls, rm)
	return cmd
}
