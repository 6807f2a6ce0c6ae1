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
	var pf pullFlags
	imp := &cobra.Command{
		Use:   "import NAME [PATH]",
		Short: "Import an OCI image (pulled from a registry, an OCI layout directory, or a docker save / OCI tarball)",
		Long: `Import an OCI image as template NAME: with --ref and no PATH the daemon pulls
it from its registry; with PATH it is uploaded from there (an OCI layout
directory, or a docker save / OCI tarball).

Its ENV, WORKDIR and USER are kept:
sessions of the template get the environment, start in WORKDIR and run as
USER unless they name another (USER must be a uid, or a user of the image's
/etc/passwd). --start-cmd also keeps its ENTRYPOINT and CMD as the template's
start command, started in the background in every new session (tagged
"start"; sessions made from a snapshot do not start it again).
On a terminal the upload's progress is shown on one line (not with --quiet).

A pull keeps the image's layers in the daemon's layer cache by digest, so a
second image sharing layers downloads only the others. Credentials come from
--username and --password-stdin, else from the docker config
(--registry-config DIR, else DOCKER_CONFIG or ~/.docker/config.json,
credential helpers included); they go to the daemon for this pull only.
Registries are spoken to over HTTPS; plain HTTP only to those named with
--insecure-registry, and to localhost. --platform picks the image of a
multi-platform index (default: the daemon host's). A pull's progress is one
line on a terminal and a line per layer otherwise (not with --quiet).`,
		Example: `  forkbox template import py312 --ref registry.example/library/python:3.12
  forkbox template import web --ref localhost:5000/web:1 --platform linux/amd64
  echo "$TOKEN" | forkbox template import app --ref ghcr.io/me/app:2 --username me --password-stdin
  docker save python:3.12-slim -o py.tar && forkbox template import py312 py.tar
  skopeo copy docker://alpine:3.20 oci:alpine:3.20 && forkbox template import alpine ./alpine
  forkbox template import --start-cmd web ./web-server.tar   # its CMD runs in every session`,
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 && ref == "" {
				return fmt.Errorf("give PATH (an image archive or OCI layout) or --ref (an image in a registry)")
			}
			if len(args) == 2 && pf.changed(cmd) {
				return fmt.Errorf("--platform, --insecure-registry, --registry-config, --username and --password-stdin are for a pull (--ref without PATH)")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			var t *client.Template
			if len(args) == 1 {
				t, err = pullTemplate(cmd, c, args[0], ref, startCmd, quiet, &pf)
			} else {
				o := client.ImportOptions{Ref: ref, StartCmd: startCmd}
				if !quiet && isTerminal(cmd.ErrOrStderr()) {
					line := &progressLine{w: cmd.ErrOrStderr()}
					defer line.done()
					what := filepath.Base(args[1])
					o.Progress = func(sent, total int64, done bool) { line.show(uploadText(what, sent, total, done), done) }
				}
				t, err = c.ImportTemplatePathWith(cmd.Context(), args[0], args[1], o)
			}
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
	imp.Flags().StringVar(&ref, "ref", "", "without PATH: the image to pull (registry.example/library/python:3.12); with PATH: the image to pick when it holds several (a tag such as python:3.12)")
	imp.Flags().BoolVar(&startCmd, "start-cmd", false, "start the image's ENTRYPOINT and CMD in the background in every new session")
	imp.Flags().BoolVarP(&quiet, "quiet", "q", false, "no progress; print only the template's name")
	pf.register(imp)
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
			// LAYERS: an image's layers; a built template's steps. TIER:
			// the isolation tier a built template's steps ran in. START
			// and READY: whether sessions start a command and wait for a
			// ready check (template inspect shows them).
			return printList(cmd.OutOrStdout(), g.json, ts, "NAME\tSOURCE\tUSER\tSIZE\tLAYERS\tTIER\tSTART\tREADY\tDIGEST\tCREATED",
				func(t client.Template) string {
					user, tier := t.User, t.Tier
					if user == "" {
						user = "-"
					}
					if tier == "" {
						tier = "-"
					}
					return fmt.Sprintf("%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s", t.Name, t.Source, user, t.SizeBytes, t.Layers, tier,
						yesOrDash(len(t.StartCmd) > 0), yesOrDash(len(t.ReadyCmd) > 0), t.Digest, t.CreatedAt)
				})
		},
	}
	inspect := &cobra.Command{
		Use:   "inspect NAME",
		Short: "Show a template: its user, workdir, start command and ready check",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.Template(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			printTemplate(cmd.OutOrStdout(), t)
			return nil
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
	cmd.AddCommand(imp, ls, inspect, rm, newTemplateBuildCmd(g))
	return cmd
}
