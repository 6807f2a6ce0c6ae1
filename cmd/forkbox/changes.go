package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

func newDiffCmd(g *globals) *cobra.Command {
	var base string
	var patch, snapshot bool
	cmd := &cobra.Command{
		Use:   "diff ID [--base SNAPSHOT] [--patch]",
		Short: "List the files a session (or, with --snapshot, a snapshot) changed relative to a snapshot",
		Long: `List the files added (A), modified (M) and deleted (D) in session ID since
snapshot --base (default: the snapshot it started from), or with --snapshot in
snapshot ID since --base (default: its parent). --patch adds unified diffs of
text files (binary files are named, not shown).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var d *client.Diff
			if snapshot {
				d, err = c.SnapshotDiff(cmd.Context(), args[0], base, patch)
			} else {
				d, err = c.SessionDiff(cmd.Context(), args[0], base, patch)
			}
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), d)
			}
			printChanges(cmd.OutOrStdout(), d.Changes, patch)
			return nil
		},
	}
	cmd.Flags().StringVar(&base, "base", "", "the snapshot to compare with")
	cmd.Flags().BoolVar(&patch, "patch", false, "show unified diffs of changed text files")
	cmd.Flags().BoolVar(&snapshot, "snapshot", false, "ID is a snapshot, not a session")
	return cmd
}

// printChanges writes one line per change ("M file  /path  (12 bytes)")
// and, with patch, the patches after.
func printChanges(w io.Writer, cs []client.FileChange, patch bool) {
	for _, c := range cs {
		what := c.Kind
		switch {
		case c.Kind == "symlink":
			what += " -> " + c.SymlinkTarget
		case c.Kind == "file":
			what += fmt.Sprintf(", %d bytes", c.Size)
		}
		fmt.Fprintf(w, "%s %s  (%s, mode %04o)\n", strings.ToUpper(c.Op[:1]), c.Path, what, c.Mode)
	}
	if !patch {
		return
	}
	for _, c := range cs {
		switch {
		case c.Patch != "":
			fmt.Fprint(w, c.Patch)
		case c.Binary:
			fmt.Fprintf(w, "Binary file %s differs\n", c.Path)
		case c.TooLarge:
			fmt.Fprintf(w, "File %s is too large to show\n", c.Path)
		case c.PatchOmitted:
			fmt.Fprintf(w, "Patch of %s omitted (the answer's patch budget is used up)\n", c.Path)
		}
	}
}

func newMergeCmd(g *globals) *cobra.Command {
	var req client.MergeRequest
	cmd := &cobra.Command{
		Use:   "merge SESSION --from OTHER [--on-conflict fail|ours|theirs] [--path P]...",
		Short: "Bring the changes another session or a snapshot made into a session (three-way merge)",
		Long: `Apply into SESSION what OTHER (a session, or a snapshot) changed since the
snapshot they share: text files both changed are merged by lines, anything
else both changed is a conflict. With --on-conflict fail (the default) a
conflict changes nothing and every conflicting path is listed; ours keeps
SESSION's version, theirs takes OTHER's whole. All or nothing.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			res, err := c.Merge(cmd.Context(), args[0], req)
			var apiErr *client.Error
			if errors.As(err, &apiErr) && apiErr.Status == http.StatusConflict && len(apiErr.Paths) > 0 {
				for _, p := range apiErr.Paths {
					fmt.Fprintln(cmd.ErrOrStderr(), "conflict:", p)
				}
				return err
			}
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), res)
			}
			printChanges(cmd.OutOrStdout(), res.Applied, false)
			for _, p := range res.Conflicts {
				fmt.Fprintf(cmd.OutOrStdout(), "conflict resolved (%s): %s\n", req.OnConflict, p)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&req.From, "from", "", "the session or snapshot whose changes to bring in (required)")
	cmd.Flags().StringVar(&req.OnConflict, "on-conflict", "fail", "fail, ours or theirs")
	cmd.Flags().StringArrayVar(&req.Paths, "path", nil, "merge only this path and what is under it (repeatable)")
	_ = cmd.MarkFlagRequired("from")
	return cmd
}

// runForks is fork --run: fork and run in every child, a line per child.
func runForks(cmd *cobra.Command, g *globals, c *client.Client, snap string, req client.ForkRequest) error {
	out := cmd.OutOrStdout()
	done, err := c.ForkRun(cmd.Context(), snap, req, func(ev client.ForkEvent) {
		if g.json {
			_ = printJSON(out, ev)
			return
		}
		score := "-"
		if ev.Score != nil {
			score = fmt.Sprint(*ev.Score)
		}
		line := fmt.Sprintf("child %d %s exit=%d score=%s %dms", ev.Index, ev.SessionID, ev.ExitCode, score, ev.DurationMS)
		if ev.Error != "" {
			line += " error: " + ev.Error
		}
		fmt.Fprintln(out, line)
	})
	if err != nil {
		return err
	}
	if g.json {
		return printJSON(out, done)
	}
	for _, id := range done.Kept {
		fmt.Fprintln(out, "kept", id)
	}
	return nil
}
