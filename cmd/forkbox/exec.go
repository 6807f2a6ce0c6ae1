package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

// execFlags are the per-command options shared by run and exec.
type execFlags struct {
	env         []string
	workdir     string
	user        string
	timeoutS    int64
	interactive bool
}

func (f *execFlags) register(cmd *cobra.Command, withSessionFlags bool) {
	fl := cmd.Flags()
	if withSessionFlags {
		fl.Int64Var(&f.timeoutS, "exec-timeout", 0, "kill the command after this many seconds (default: the session timeout)")
	} else {
		fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
		fl.StringVarP(&f.workdir, "workdir", "w", "", "working directory")
		fl.StringVarP(&f.user, "user", "u", "", "user to run as")
		fl.Int64Var(&f.timeoutS, "timeout", 0, "kill the command after this many seconds (default 60)")
	}
	fl.BoolVarP(&f.interactive, "interactive", "i", false, "send this program's stdin to the command (read to EOF first, up to 32 MiB)")
}

// runCommand execs argv in session id, streams its output to this
// process's stdout and stderr, and returns its exit code as *ExitError.
func runCommand(cmd *cobra.Command, c *client.Client, id string, argv []string, f *execFlags, env map[string]string) error {
	req := client.ExecRequest{Argv: argv, Env: env, Cwd: f.workdir, User: f.user, TimeoutS: f.timeoutS}
	if f.interactive {
		data, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 32<<20+1))
		if err != nil {
			return err
		}
		if len(data) > 32<<20 {
			return fmt.Errorf("stdin is larger than 32 MiB; upload it with forkbox cp instead")
		}
		req.Stdin = data
	}
	res, err := c.Exec(cmd.Context(), id, req, cmd.OutOrStdout(), cmd.ErrOrStderr())
	if err != nil {
		return err
	}
	switch {
	case res.TimedOut:
		fmt.Fprintf(cmd.ErrOrStderr(), "forkbox: command timed out and was killed\n")
	case res.OOMKilled:
		fmt.Fprintf(cmd.ErrOrStderr(), "forkbox: command was killed for running out of memory\n")
	}
	if res.ExitCode != 0 {
		return &ExitError{Code: res.ExitCode}
	}
	return nil
}

func newRunCmd(g *globals) *cobra.Command {
	var cf createFlags
	var ef execFlags
	cmd := &cobra.Command{
		Use:   "run [flags] -- COMMAND [ARG...]",
		Short: "Run a command in a new sandbox, stream its output, destroy the sandbox",
		Long: `Create a sandbox, run COMMAND in it with its output streamed here, destroy the
sandbox and exit with the command's exit status (128+N after signal N; 125
when forkbox itself failed; 127 when the command does not exist).`,
		Example: `  forkbox run -- python3 -c 'import sys; print(sys.version); sys.exit(3)'
  forkbox run --memory 1024 -e DEBUG=1 -- sh -c 'echo $DEBUG'`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			s, err := cf.create(cmd.Context(), c)
			if err != nil {
				return err
			}
			defer destroyQuietly(cmd.ErrOrStderr(), c, s.ID)
			ef.workdir, ef.user = cf.workdir, cf.user
			if ef.timeoutS == 0 {
				ef.timeoutS = s.TimeoutS
			}
			return runCommand(cmd, c, s.ID, args, &ef, nil)
		},
	}
	cf.register(cmd)
	ef.register(cmd, true)
	cmd.Flags().SetInterspersed(false)
	return cmd
}

func newExecCmd(g *globals) *cobra.Command {
	var ef execFlags
	cmd := &cobra.Command{
		Use:   "exec [flags] ID -- COMMAND [ARG...]",
		Short: "Run a command in an existing sandbox and exit with its status",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			env, err := parseEnv(ef.env)
			if err != nil {
				return err
			}
			argv := args[1:]
			if argv[0] == "--" {
				argv = argv[1:]
			}
			if len(argv) == 0 {
				return fmt.Errorf("no command given after the session id")
			}
			return runCommand(cmd, c, args[0], argv, &ef, env)
		},
	}
	ef.register(cmd, false)
	cmd.Flags().SetInterspersed(false)
	return cmd
}
