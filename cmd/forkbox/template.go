package main

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

func newTemplateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "template", Short: "Manage templates (root filesystems sandboxes start from)"}
	var ref string
	var startCmd, quiet bool
	imp := &cobra.Command{
		Use:   "import NAME PATH",
		Short: "Import an OCI image (an OCI layout directory, or a docker save / OCI tarball)",
		Long: `Import an OCI image as template NAME. Its ENV, WORKDIR and USER are kept:
sessions of the template get the environment, start in WORKDIR and run as
USER unless they name another (USER must be a uid, or a user of the image's
/etc/passwd). --start-cmd also keeps its ENTRYPOINT and CMD as the template's
start command, started in the background in every new session (tagged
"start"; sessions made from a snapshot do not start it again).
On a terminal the upload's progress is shown on one line (not with --quiet).`,
		Example: `  docker save python:3.12-slim -o py.tar && forkbox template import py312 py.tar
  skopeo copy docker://alpine:3.20 oci:alpine:3.20 && forkbox template import alpine ./alpine
  forkbox template import --start-cmd web ./web-server.tar   # its CMD runs in every session`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			o := client.ImportOptions{Ref: ref, StartCmd: startCmd}
			if !quiet && isTerminal(cmd.ErrOrStderr()) {
				line := &progressLine{w: cmd.ErrOrStderr()}
				defer line.done()
				what := filepath.Base(args[1])
				o.Progress = func(sent, total int64, done bool) { line.show(uploadText(what, sent, total, done), done) }
			}
			t, err := c.ImportTemplatePathWith(cmd.Context(), args[0], args[1], o)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			if quiet {
				fmt.Fprintln(cmd.OutOrStdout(), t.Name)
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "imported %s (%s, %d layers, %s)\n", t.Name, t.Digest, t.Layers, bytesText(t.SizeBytes))
			if t.User != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "  user:    %s\n", t.User)
			}
			if t.Workdir != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "  workdir: %s\n", t.Workdir)
			}
			switch {
			case len(t.StartCmd) > 0:
				fmt.Fprintf(cmd.OutOrStdout(), "  start:   %s (in the background in every new session)\n", strings.Join(t.StartCmd, " "))
			case len(t.Cmd) > 0:
				fmt.Fprintf(cmd.OutOrStdout(), "  cmd:     %s (not started; --start-cmd starts it in every session)\n", strings.Join(t.Cmd, " "))
			}
			return nil
		},
	}
	imp.Flags().StringVar(&ref, "ref", "", "image to pick when PATH holds several (a tag such as python:3.12)")
	imp.Flags().BoolVar(&startCmd, "start-cmd", false, "start the image's ENTRYPOINT and CMD in the background in every new session")
	imp.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress; print only the template's name")
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
			return printList(cmd.OutOrStdout(), g.json, ts, "NAME\tSOURCE\tUSER\tSIZE\tDIGEST\tCREATED",
				func(t client.Template) string {
					user := t.User
					if user == "" {
						user = "-"
					}
					return fmt.Sprintf("%s\t%s\t%s\t%d\t%s\t%s", t.Name, t.Source, user, t.SizeBytes, t.Digest, t.CreatedAt)
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
