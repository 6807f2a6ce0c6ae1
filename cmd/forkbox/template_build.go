package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

// newTemplateBuildCmd is `forkbox template build`.
func newTemplateBuildCmd(g *globals) *cobra.Command {
	var file, contextDir, fromImage, start, ready, isolation string
	var readyTimeout int64
	var runs, allow, buildArgs, insecure []string
	var quiet bool
	cmd := &cobra.Command{
		Use:   "build NAME (-f Dockerfile [--context DIR] | --from-image REF [--run CMD]... [--start CMD]) [--ready CMD]",
		Short: "Build a template from a Dockerfile, each RUN in a sandbox, every step cached",
		Long: `Build template NAME from a Dockerfile on the daemon. FROM names base, a
template of yours, or a registry image (pulled once into a template named
from-HASH, per tenant). RUN steps run in forkbox sandboxes (as the Dockerfile's USER,
with no network unless --allow names hosts); COPY and ADD read the --context
directory, sent as a tar; ENV, ARG, WORKDIR, USER are kept, and CMD or
ENTRYPOINT becomes the template's start command, and HEALTHCHECK CMD its
ready check (HEALTHCHECK NONE: none). Each step's result is a
snapshot cached by its parent, its instruction and its inputs, so a rebuild
of an unchanged Dockerfile runs no sandbox and a change at step k reruns
only the steps from k on.

--from-image REF with --run (repeatable) and --start is the same as a
Dockerfile of FROM REF, one RUN per --run, and CMD as --start's shell line.

--ready CMD (a shell line) is the template's ready check, in place of the
Dockerfile's HEALTHCHECK: a session created from the template runs the
start command, then the create returns only once CMD exits 0 inside the
sandbox (tried every 50 ms, for at most --ready-timeout seconds: default
HEALTHCHECK --start-period, else 30); a check that never passes fails the
create with its last output and leaves no session. A build with
--isolation gvisor of a template with a start command keeps the started
server in a memory snapshot, which gVisor creates that ask for no env,
user, workdir, network or volumes restore: the server is already running.

Steps and their output are printed on standard error, one line each (on a
terminal the running step is a status line redrawn in place; --quiet:
nothing); the template's name is printed when it is ready.`,
		Example: `  forkbox template build py-data -f Dockerfile --context . --allow 'pypi.org:443,files.pythonhosted.org:443'
  forkbox template build web --from-image registry.example/node:22 --run 'npm i -g pnpm' --start 'node server.js' --ready 'curl -fs localhost:3000'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var dockerfile string
			switch {
			case file != "" && fromImage != "":
				return fmt.Errorf("give -f or --from-image, not both")
			case file != "":
				if len(runs) > 0 || start != "" {
					return fmt.Errorf("--run and --start go with --from-image")
				}
				b, err := os.ReadFile(file)
				if err != nil {
					return err
				}
				dockerfile = string(b)
			case fromImage != "":
				dockerfile = shorthandDockerfile(fromImage, runs, start)
			default:
				return fmt.Errorf("give -f Dockerfile or --from-image REF")
			}
			req := client.BuildRequest{Dockerfile: dockerfile, Isolation: isolation, InsecureRegistries: insecure,
				ReadyTimeoutS: readyTimeout}
			if cmd.Flags().Changed("ready") {
				req.ReadyCmd = &ready
			}
			for _, a := range allow {
				for _, h := range strings.Split(a, ",") {
					if h = strings.TrimSpace(h); h != "" {
						req.Allow = append(req.Allow, h)
					}
				}
			}
			for _, kv := range buildArgs {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					v = os.Getenv(k)
				}
				if req.BuildArgs == nil {
					req.BuildArgs = map[string]string{}
				}
				req.BuildArgs[k] = v
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			o := client.BuildOptions{ContextDir: contextDir}
			if !quiet {
				o.Progress = buildPrinter(cmd)
			}
			res, err := c.BuildTemplate(cmd.Context(), args[0], req, o)
			if err != nil {
				return err
			}
			if g.json {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			if !quiet {
				fmt.Fprintf(cmd.ErrOrStderr(), "built %s: %d steps, %d sandboxes, %d bytes\n",
					res.Template.Name, len(res.Steps), res.Sandboxes, res.Template.SizeBytes)
			}
			fmt.Fprintln(cmd.OutOrStdout(), res.Template.Name)
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&file, "file", "f", "", "the Dockerfile")
	fs.StringVar(&contextDir, "context", "", "the build context directory COPY and ADD read (sent as a tar)")
	fs.StringArrayVar(&allow, "allow", nil, "egress the RUN steps may use: host:port, *.suffix:port or a CIDR, comma-separated or repeated (default: none)")
	fs.StringArrayVar(&buildArgs, "build-arg", nil, "an ARG's value, KEY=VALUE (KEY alone: from the environment)")
	fs.StringVar(&isolation, "isolation", "", "the tier RUN steps run in (runc, gvisor; default: the daemon's)")
	fs.StringArrayVar(&insecure, "insecure-registry", nil, "a registry a FROM image may be pulled from over plain HTTP")
	fs.StringVar(&fromImage, "from-image", "", "shorthand: the image (or template) to start from")
	fs.StringArrayVar(&runs, "run", nil, "shorthand: a shell command to run (repeatable, in order)")
	fs.StringVar(&start, "start", "", "shorthand: the start command (a shell line)")
	fs.StringVar(&ready, "ready", "", "the ready check, a shell line: a create waits until it exits 0 (in place of HEALTHCHECK)")
	fs.Int64Var(&readyTimeout, "ready-timeout", 0, "seconds a create waits for the ready check (default: HEALTHCHECK --start-period, else 30; at most 600)")
	fs.BoolVarP(&quiet, "quiet", "q", false, "print only the template's name")
	return cmd
}

// shorthandDockerfile is the Dockerfile --from-image, --run and --start
// stand for.
func shorthandDockerfile(from string, runs []string, start string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "FROM %s\n", from)
	for _, r := range runs {
		j, _ := json.Marshal([]string{"/bin/sh", "-c", r})
		fmt.Fprintf(&b, "RUN %s\n", j)
	}
	if start != "" {
		j, _ := json.Marshal([]string{"/bin/sh", "-c", start})
		fmt.Fprintf(&b, "CMD %s\n", j)
	}
	return b.String()
}

// buildPrinter prints a build's events on standard error: a line per
// step begun and ended, a RUN's output as it comes (on a terminal:
// ttyBuildPrinter).
func buildPrinter(cmd *cobra.Command) func(client.BuildEvent) {
	w := cmd.ErrOrStderr()
	if isTerminal(w) {
		return ttyBuildPrinter(w)
	}
	return func(e client.BuildEvent) {
		switch e.Kind {
		case "step":
			fmt.Fprintf(w, "[%d/%d] %s\n", e.Step, e.Total, e.Instruction)
		case "done":
			if e.Cached {
				fmt.Fprintf(w, "[%d/%d] cached\n", e.Step, e.Total)
			} else {
				fmt.Fprintf(w, "[%d/%d] done in %.1fs\n", e.Step, e.Total, float64(e.DurationMS)/1000)
			}
		case "log":
			fmt.Fprint(w, e.Data)
		case "failed":
			fmt.Fprintf(w, "[%d/%d] failed: exit code %d\n", e.Step, e.Total, e.ExitCode)
		}
	}
}

// ttyBuildPrinter shows a build on a terminal: the running step on a
// status line redrawn in place (a RUN's output is
// printed above it as it comes), then one line per step as it ends
// ("[2/5] RUN make: done in 3.1s", "cached", "failed: exit code 2").
func ttyBuildPrinter(w io.Writer) func(client.BuildEvent) {
	line := &progressLine{w: w}
	var cur client.BuildEvent
	midLine := false // the RUN's output so far does not end in a newline
	status := func(force bool) {
		if !midLine && cur.Step > 0 {
			line.show(fmt.Sprintf("[%d/%d] %s ...", cur.Step, cur.Total, truncateText(cur.Instruction, 60)), force)
		}
	}
	return func(e client.BuildEvent) {
		switch e.Kind {
		case "step":
			cur, midLine = e, false
			status(true)
		case "log":
			line.done()
			fmt.Fprint(w, e.Data)
			midLine = !strings.HasSuffix(e.Data, "\n")
			status(true)
		case "done", "failed":
			line.done()
			if midLine {
				fmt.Fprintln(w)
				midLine = false
			}
			what := fmt.Sprintf("done in %.1fs", float64(e.DurationMS)/1000)
			switch {
			case e.Kind == "failed":
				what = fmt.Sprintf("failed: exit code %d", e.ExitCode)
			case e.Cached:
				what = "cached"
			}
			fmt.Fprintf(w, "[%d/%d] %s: %s\n", cur.Step, cur.Total, cur.Instruction, what)
			cur = client.BuildEvent{}
		}
	}
}

// truncateText is s cut to n runes, with "..." when it was longer.
func truncateText(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "..."
}
