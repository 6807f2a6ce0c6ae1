package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

// createFlags are the session options shared by run and create.
type createFlags struct {
	template  string
	cpu       float64
	memoryMB  int64
	pids      int64
	timeoutS  int64
	env       []string
	meta      []string
	workdir   string
	user      string
	snapshot  string
	diskMB    int64
	autoPause time.Duration
	allow     []string
	egressMB  int64
	isolation string
	host      string
	secrets   []string
	volumes   []string
}

func (f *createFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.template, "template", "", `template to start from (default "base")`)
	fl.Float64Var(&f.cpu, "cpu", 0, "CPU quota in cores (default 1)")
	fl.Int64Var(&f.memoryMB, "memory", 0, "memory limit in MiB (default 512)")
	fl.Int64Var(&f.pids, "pids", 0, "process and thread limit (default 512)")
	fl.Int64Var(&f.timeoutS, "timeout", 0, "session lifetime in seconds (default 300)")
	fl.StringArrayVarP(&f.env, "env", "e", nil, "environment variable KEY=VALUE (repeatable)")
	fl.StringArrayVar(&f.meta, "label", nil, "metadata KEY=VALUE (repeatable)")
	fl.StringVarP(&f.workdir, "workdir", "w", "", "working directory (default: the template's WORKDIR, else the user's home)")
	fl.StringVarP(&f.user, "user", "u", "", `user to run as (default: the template's USER, else "user"; "root" on request)`)
	fl.StringVar(&f.snapshot, "snapshot", "", "start from this snapshot's files instead of a template")
	fl.Int64Var(&f.diskMB, "disk", 0, "disk limit in MiB (default 4096)")
	fl.DurationVar(&f.autoPause, "auto-pause", 0, "pause after this long without exec or file calls (e.g. 5m)")
	fl.StringArrayVar(&f.allow, "allow", nil,
		"give the sandbox a network to this destination only: host:port, *.domain:port or a CIDR (repeatable)")
	fl.Int64Var(&f.egressMB, "egress-quota", 0, "egress byte quota in MiB, sent plus received (with --allow; default 1024)")
	fl.StringArrayVar(&f.secrets, "secret", nil,
		"let the sandbox use this secret (forkbox secret set): its variable holds a placeholder the egress proxy replaces over TLS to the secret's hosts (repeatable; needs --allow HOST:443)")
	fl.StringVar(&f.isolation, "isolation", "", `isolation driver: "runc" or "gvisor" (default: the server's)`)
	fl.StringVar(&f.host, "host", "", "in a fleet: run the session on this host (forkbox hosts lists them; needs an admin key)")
	fl.StringArrayVar(&f.volumes, "volume", nil,
		"mount a volume (forkbox volume create): NAME:PATH[:ro], PATH below /home/user or /mnt (repeatable)")
}

// create makes a session from the flags.
func (f *createFlags) create(ctx context.Context, c *client.Client) (*client.Session, error) {
	req, err := f.request()
	if err != nil {
		return nil, err
	}
	s, _, err := c.CreateSession(ctx, req, "")
	return s, err
}

func (f *createFlags) request() (client.CreateRequest, error) {
	env, err := parseEnv(f.env)
	if err != nil {
		return client.CreateRequest{}, err
	}
	var meta map[string]string
	for _, kv := range f.meta {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return client.CreateRequest{}, fmt.Errorf("--label %q: want KEY=VALUE", kv)
		}
		if meta == nil {
			meta = map[string]string{}
		}
		meta[k] = v
	}
	var network *client.Network
	if len(f.allow) > 0 {
		network = &client.Network{Allow: f.allow, MaxEgressBytes: f.egressMB << 20}
	} else if f.egressMB != 0 {
		return client.CreateRequest{}, fmt.Errorf("--egress-quota needs --allow (without it the sandbox has no network)")
	}
	mounts, err := parseVolumeMounts(f.volumes)
	if err != nil {
		return client.CreateRequest{}, err
	}
	return client.CreateRequest{
		Template: f.template, CPU: f.cpu, MemoryMB: f.memoryMB, Pids: f.pids, TimeoutS: f.timeoutS,
		Env: env, Metadata: meta, Workdir: f.workdir, User: f.user,
		Snapshot: f.snapshot, DiskMB: f.diskMB, AutoPauseS: int64(f.autoPause.Seconds()), Network: network,
		Isolation: f.isolation, Secrets: f.secrets, Volumes: mounts, Host: f.host,
	}, nil
}

func newCreateCmd(g *globals) *cobra.Command {
	var cf createFlags
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a sandbox session and print its id",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			s, err := cf.create(cmd.Context(), c)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), s)
			}
			fmt.Fprintln(cmd.OutOrStdout(), s.ID)
			return nil
		},
	}
	cf.register(cmd)
	return cmd
}

func newLsCmd(g *globals) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List sessions (those not ended; --all for every one)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ss, err := c.ListSessions(cmd.Context(), client.ListOptions{All: all})
			if err != nil {
				return err
			}
			return printList(cmd.OutOrStdout(), g.json, ss, "ID\tTEMPLATE\tSTATE\tCPU\tMEMORY\tCREATED\tEXPIRES\tLABELS",
				func(s client.Session) string {
					state := s.State
					if s.Reason != "" {
						state += " (" + s.Reason + ")"
					}
					return fmt.Sprintf("%s\t%s\t%s\t%g\t%dMiB\t%s\t%s\t%s", s.ID, s.Template, state, s.CPU, s.MemoryMB,
						ago(s.CreatedAt), until(s.ExpiresAt, s.State), labels(s.Metadata))
				})
		},
	}
	cmd.Flags().BoolVarP(&all, "all", "a", false, "include ended sessions")
	return cmd
}

func newRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm ID...",
		Short: "Destroy sessions now",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			var firstErr error
			for _, id := range args {
				if err := c.DeleteSession(cmd.Context(), id); err != nil {
					fmt.Fprintln(cmd.ErrOrStderr(), "forkbox:", forItem(id, err))
					if firstErr == nil {
						firstErr = err
					}
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), id)
			}
			if firstErr != nil {
				return &ExitError{Code: exitForkboxError} // (each failure was printed above)
			}
			return nil
		},
	}
}

func newEgressCmd(g *globals) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "egress ID",
		Short: "Show a session's egress records: connections, refusals and DNS queries",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			recs, err := c.Egress(cmd.Context(), args[0], 0, limit)
			if err != nil {
				return err
			}
			return printList(cmd.OutOrStdout(), g.json, recs, "TIME\tKIND\tHOST\tADDRESS\tPORT\tUP\tDOWN\tDECISION\tREASON",
				func(r client.EgressRecord) string {
					return fmt.Sprintf("%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s", r.Time.Local().Format("15:04:05.000"), r.Kind,
						r.Host, r.Addr, r.Port, r.BytesUp, r.BytesDown, r.Decision, r.Reason)
				})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 1000, "at most this many records (1-1000), oldest first")
	return cmd
}

func ago(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return time.Since(*t).Round(time.Second).String() + " ago"
}

func until(t *time.Time, state string) string {
	if t == nil || state != "running" {
		return "-"
	}
	return "in " + time.Until(*t).Round(time.Second).String()
}

func labels(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, ",")
}

// destroyQuietly deletes a session with a fresh context (the command's may
// be cancelled by Ctrl-C) and reports failures on stderr.
func destroyQuietly(stderr io.Writer, c *client.Client, id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.DeleteSession(ctx, id); err != nil {
		fmt.Fprintf(stderr, "forkbox: destroy %s: %v\n", id, err)
	}
}
