// Command forkbox is the forkbox command line (cobra) and its daemon
// (forkbox serve). Every command except serve, down and bench talks to a
// daemon through package client; serve and down call package daemon, bench
// package bench. The files here only map flags and arguments to those
// calls and print their results: one file per command group.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/defaults"
)

// Exit codes of the CLI itself (a command's own exit code passes through).
const (
	exitForkboxError = 125 // forkbox could not run the command (as docker run)
	exitNotFound     = 127 // the command was not found in the sandbox
)

// ExitError carries the process exit code out of a command.
type ExitError struct{ Code int }

// Error returns "exit status N".
func (e *ExitError) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// globals are the flags every command shares.
type globals struct {
	json    bool
	keyFile string
	url     string // --url ("" = FORKBOX_URL, else the default)
	apiKey  string // --api-key ("" = FORKBOX_API_KEY, else the key file)
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := execute(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// execute runs the CLI with args (without the program name), reading
// stdin and writing stdout and stderr, until ctx ends; it returns the
// process exit code: the command's own in exec and run, 0 on success,
// 125 when forkbox failed (a bad flag or argument too, as docker run) and
// 127 for a command not found in the sandbox.
func execute(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	g := &globals{}
	root := &cobra.Command{
		Use:           "forkbox",
		Short:         "Run untrusted code in isolated, forkable sandboxes",
		Long:          rootLong,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().BoolVar(&g.json, "json", false, "print JSON instead of tables")
	root.PersistentFlags().StringVar(&g.keyFile, "api-key-file", defaults.KeyFile,
		"API key file read when "+client.EnvAPIKey+" is unset and the daemon is local")
	g.registerDaemonFlags(root)
	root.AddCommand(
		newServeCmd(), newDownCmd(), newRunCmd(g), newCreateCmd(g), newLsCmd(g), newExecCmd(g), newRunCodeCmd(g), newReplCmd(g), newCpCmd(g),
		newRmCmd(g), newTemplateCmd(g), newVersionCmd(g), newBenchCmd(g),
		newSnapshotCmd(g), newForkCmd(g), newDiffCmd(g), newMergeCmd(g), newPauseCmd(g, false), newPauseCmd(g, true), newMigrateCmd(g), newPoolCmd(g),
		newEgressCmd(g), newSecretCmd(g), newVolumeCmd(g), newTenantCmd(g), newKeyCmd(g), newAuditCmd(g), newMCPCmd(g), newPortForwardCmd(g), newHostsCmd(g), newHostCmd(g),
	)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var exit *ExitError
	if errors.As(err, &exit) {
		return exit.Code
	}
	fmt.Fprintln(stderr, "forkbox:", err)
	var apiErr *client.Error
	if errors.As(err, &apiErr) && apiErr.Field == "argv" {
		return exitNotFound
	}
	return exitForkboxError
}

// forItem is err of the command's item id (a session, snapshot, key or
// tenant of several): "ID: err", or err alone when id is empty (err then
// says the id is required) or when err names "ID" already.
func forItem(id string, err error) error {
	if id == "" || strings.Contains(err.Error(), strconv.Quote(id)) {
		return err // (it names id already: `session "x" not found`)
	}
	return fmt.Errorf("%s: %w", id, err)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printList prints items as indented JSON when asJSON, else as a table:
// header (tab-separated column names), then row(item) for each item
// (tab-separated cells, no newline).
func printList[T any](w io.Writer, asJSON bool, items []T, header string, row func(T) string) error {
	if asJSON {
		return printJSON(w, items)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, it := range items {
		fmt.Fprintln(tw, row(it))
	}
	return tw.Flush()
}

// parseEnv turns KEY=VALUE flags into a map; a bare KEY takes the local
// environment's value.
func parseEnv(kvs []string) (map[string]string, error) {
	if len(kvs) == 0 {
		return nil, nil
	}
	env := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if k == "" {
			return nil, fmt.Errorf("--env %q: missing name", kv)
		}
		if !ok {
			v = os.Getenv(k)
		}
		env[k] = v
	}
	return env, nil
}
