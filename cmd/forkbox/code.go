package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

// codeFlags are the options of run-code and repl.
type codeFlags struct {
	language  string
	contextID string
	env       []string
}

func (f *codeFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVarP(&f.language, "language", "l", "", "python (default), javascript or bash: the default context of that language")
	fl.StringVar(&f.contextID, "context", "", "run in this context (from the API's code/contexts) instead of a language's default one")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE for this cell only (repeatable)")
}

// run executes code in session id and prints what it gives: stdout and
// stderr as they come, then the main result's text (and a line per rich
// result format), the error's traceback on stderr. With asJSON each line
// of the stream is printed as the API sent it. A cell that failed is
// *ExitError 1.
func (f *codeFlags) run(ctx context.Context, c *client.Client, id, code string, asJSON bool, out, errOut io.Writer) error {
	env, err := parseEnv(f.env)
	if err != nil {
		return err
	}
	req := client.CodeRequest{Code: code, ContextID: f.contextID, Language: f.language, EnvVars: env}
	ex, err := c.RunCode(ctx, id, req, func(l client.CodeLine) {
		switch {
		case asJSON:
			_ = printJSON(out, l.Data)
		case l.Type == "stdout":
			fmt.Fprint(out, l.Text)
		case l.Type == "stderr":
			fmt.Fprint(errOut, l.Text)
		case l.Type == "result":
			printResult(out, l)
		case l.Type == "error":
			fmt.Fprintln(errOut, l.Traceback)
			if l.Traceback == "" {
				fmt.Fprintf(errOut, "%s: %s\n", l.Name, l.Value)
			}
		}
	})
	if err != nil {
		return err
	}
	if ex.Error != nil {
		return &ExitError{Code: 1}
	}
	return nil
}

// printResult prints a result line: its text, and for each other format
// (png, html, chart ...) its name and size.
func printResult(w io.Writer, l client.CodeLine) {
	if l.Text != "" {
		fmt.Fprintln(w, l.Text)
	}
	var formats []string
	for k, v := range l.Data {
		switch k {
		case "type", "text", "is_main_result":
			continue
		}
		if s, ok := v.(string); ok {
			formats = append(formats, fmt.Sprintf("%s, %d bytes", k, len(s)))
		} else {
			formats = append(formats, k)
		}
	}
	sort.Strings(formats)
	for _, f := range formats {
		fmt.Fprintf(w, "[%s]\n", f)
	}
}

func newRunCodeCmd(g *globals) *cobra.Command {
	var f codeFlags
	cmd := &cobra.Command{
		Use:   "run-code [flags] ID CODE",
		Short: "Run code in a sandbox's stateful interpreter (Python, JavaScript, bash)",
		Long: `Run CODE ("-": read it from stdin) in the code-execution service of sandbox ID:
a Jupyter kernel for Python that keeps its state between calls, as E2B's code
interpreter does. Output is streamed; the value of the last expression is
printed after it; rich results (charts, tables) are listed by format (--json
prints every line of the stream). Exits 1 when the cell raised an error.`,
		Example: `  forkbox run-code $ID 'x = 41'
  forkbox run-code $ID 'x + 1'
  forkbox run-code -l bash $ID 'cd /tmp && ls'`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			code := args[1]
			if code == "-" {
				b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 1<<20+1))
				if err != nil {
					return err
				}
				if len(b) > 1<<20 {
					return fmt.Errorf("the code on stdin is over 1 MiB")
				}
				code = string(b)
			}
			return f.run(cmd.Context(), c, args[0], code, g.json, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f.register(cmd)
	return cmd
}

func newReplCmd(g *globals) *cobra.Command {
	var f codeFlags
	cmd := &cobra.Command{
		Use:   "repl [flags] ID",
		Short: "An interactive session with a sandbox's stateful interpreter",
		Long: `Read cells from stdin and run each in the code-execution service of sandbox ID
(see run-code). A line ending in ":" or "\" starts a block that an empty line
ends. Ctrl-C interrupts the running cell; Ctrl-D ends the session (the
interpreter keeps its state for the next run-code or repl).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			return f.repl(cmd.Context(), c, args[0], g.json, cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	f.register(cmd)
	return cmd
}

// repl reads cells from in and runs each (see newReplCmd). An interrupt
// (SIGINT) cancels the running cell only.
func (f *codeFlags) repl(ctx context.Context, c *client.Client, id string, asJSON bool, in io.Reader, out, errOut io.Writer) error {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt)
	defer signal.Stop(sigs)
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for {
		fmt.Fprint(errOut, ">>> ")
		var cell []string
		for sc.Scan() {
			line := sc.Text()
			if len(cell) > 0 && strings.TrimSpace(line) == "" {
				break
			}
			cell = append(cell, line)
			if t := strings.TrimRight(line, " \t"); len(cell) == 1 && !strings.HasSuffix(t, ":") && !strings.HasSuffix(t, `\`) {
				break
			}
			fmt.Fprint(errOut, "... ")
		}
		if len(cell) == 0 {
			if err := sc.Err(); err != nil {
				return err
			}
			fmt.Fprintln(errOut)
			return nil
		}
		code := strings.Join(cell, "\n")
		if strings.TrimSpace(code) == "" {
			continue
		}
		cellCtx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-sigs:
				cancel()
			case <-cellCtx.Done():
			}
		}()
		err := f.run(cellCtx, c, id, code, asJSON, out, errOut)
		interrupted := cellCtx.Err() != nil && ctx.Err() == nil
		cancel()
		switch {
		case interrupted:
			fmt.Fprintln(errOut, "(interrupted)")
		case err != nil:
			if _, failed := err.(*ExitError); !failed {
				fmt.Fprintln(errOut, "forkbox:", err)
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}
