package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

// policyFlags are the flags that make up a tenant policy.
type policyFlags struct {
	p          client.TenantPolicy
	maxTimeout time.Duration
}

// policyFlagNames are the flags register adds, to tell whether any was given.
var policyFlagNames = []string{"templates", "max-cpu", "max-memory-mb", "max-disk-mb", "max-pids",
	"max-timeout", "max-sessions", "max-snapshots", "max-templates", "max-template-mb", "suspend-when-flagged", "cpu-seconds-per-day", "egress-allow"}

func (f *policyFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringSliceVar(&f.p.Templates, "templates", nil, "templates the tenant may start sessions from, comma-separated (default: any)")
	fs.Float64Var(&f.p.MaxCPU, "max-cpu", 0, "largest CPU quota of a session, in cores (0: no limit)")
	fs.Int64Var(&f.p.MaxMemoryMB, "max-memory-mb", 0, "largest memory limit of a session, in MiB (0: no limit)")
	fs.Int64Var(&f.p.MaxDiskMB, "max-disk-mb", 0, "largest disk limit of a session, in MiB (0: no limit)")
	fs.Int64Var(&f.p.MaxPids, "max-pids", 0, "largest task limit of a session (0: no limit)")
	fs.DurationVar(&f.maxTimeout, "max-timeout", 0, "longest session timeout, e.g. 1h (0: no limit)")
	fs.IntVar(&f.p.MaxSessions, "max-sessions", 0, "most sessions the tenant may have at once (0: no limit)")
	fs.IntVar(&f.p.MaxSnapshots, "max-snapshots", 0, "most snapshots the tenant may keep (0: no limit)")
	fs.IntVar(&f.p.MaxTemplates, "max-templates", 0, "most imported templates the tenant may keep (0: no limit)")
	fs.IntVar(&f.p.MaxVolumes, "max-volumes", 0, "most volumes the tenant may keep, sessions' copies included (0: no limit)")
	fs.Int64Var(&f.p.MaxTemplateMB, "max-template-mb", 0, "largest template the tenant may import or pull, in MiB of compressed layers and of files (0: no limit)")
	fs.BoolVar(&f.p.SuspendWhenFlagged, "suspend-when-flagged", false, "refuse the tenant's creates while the abuse detector's flag is on it")
	fs.Int64Var(&f.p.CPUSecondsPerDay, "cpu-seconds-per-day", 0, "CPU budget per UTC day, in CPU-seconds over all its sessions (0: no limit)")
	fs.StringSliceVar(&f.p.EgressAllow, "egress-allow", nil,
		`hosts and networks the tenant's sessions may reach, comma-separated ("*": anything; default: no network)`)
}

// changed reports whether any policy flag was given.
func (f *policyFlags) changed(cmd *cobra.Command) bool {
	for _, n := range policyFlagNames {
		if cmd.Flags().Changed(n) {
			return true
		}
	}
	return false
}

// policy returns the policy the flags give.
func (f *policyFlags) policy() (client.TenantPolicy, error) {
	if f.maxTimeout < 0 {
		return client.TenantPolicy{}, fmt.Errorf("--max-timeout %v: must not be negative", f.maxTimeout)
	}
	p := f.p
	// Round up so that a sub-second limit does not become "no limit".
	p.MaxTimeoutS = int64((f.maxTimeout + time.Second - 1) / time.Second)
	return p, nil
}

func newTenantCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tenant",
		Short: "Manage tenants and their policies (admin key)",
		Long: `Manage tenants: each API key belongs to one, and its policy bounds what the
key's sessions may use. These commands need an admin key.`,
	}
	var cf policyFlags
	create := &cobra.Command{
		Use:   "create NAME [flags]",
		Short: "Create a tenant with the policy the flags give",
		Long: `Create a tenant. NAME is 1-63 lower-case letters, digits and '-', starting with a
letter. Limits not given do not apply; without --egress-allow its sessions have no network.`,
		Example: `  forkbox tenant create acme --max-sessions 10 --max-cpu 2 --egress-allow '*'`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := cf.policy()
			if err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.CreateTenant(cmd.Context(), args[0], p)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			fmt.Fprintln(cmd.OutOrStdout(), t.Name)
			return nil
		},
	}
	cf.register(create)
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List tenants with their sessions and today's CPU use",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ts, err := c.Tenants(cmd.Context())
			if err != nil {
				return err
			}
			return printList(cmd.OutOrStdout(), g.json, ts, "NAME\tSESSIONS\tCPU TODAY\tMAX SESSIONS\tFLAGGED\tCREATED",
				func(t client.Tenant) string {
					return fmt.Sprintf("%s\t%d\t%.1fs\t%s\t%s\t%s", t.Name, t.Sessions, t.CPUSecondsToday,
						limitText(int64(t.Policy.MaxSessions), ""), flagText(t), ago(&t.CreatedAt))
				})
		},
	}
	show := &cobra.Command{
		Use:   "show NAME",
		Short: "Show a tenant's policy, usage and abuse flag",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.GetTenant(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			return printTenant(cmd.OutOrStdout(), t)
		},
	}
	var sf policyFlags
	var clearFlag bool
	set := &cobra.Command{
		Use:   "set NAME [flags]",
		Short: "Replace a tenant's whole policy with the flags given; --clear-flag clears its abuse flag",
		Long: `Replace a tenant's whole policy with the policy flags given: a limit not given
is removed (no limit), and without --egress-allow its sessions lose the network.
Pass the full policy every time (see forkbox tenant show NAME).

Without any policy flag the policy is kept as it is, so
"forkbox tenant set NAME --clear-flag" only clears the abuse flag. To remove
every limit, give one flag at its zero value, e.g. --max-sessions 0.`,
		Example: `  forkbox tenant set acme --max-sessions 20 --max-cpu 2 --egress-allow '*'
  forkbox tenant set acme --clear-flag`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !sf.changed(cmd) && !clearFlag {
				return fmt.Errorf("nothing to change: give policy flags or --clear-flag (see --help)")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			var p client.TenantPolicy
			if sf.changed(cmd) {
				if p, err = sf.policy(); err != nil {
					return err
				}
			} else {
				cur, err := c.GetTenant(cmd.Context(), args[0])
				if err != nil {
					return err
				}
				p = cur.Policy
			}
			t, err := c.UpdateTenant(cmd.Context(), args[0], p, clearFlag)
			if err != nil {
				return err
			}
			if g.json {
				return printJSON(cmd.OutOrStdout(), t)
			}
			fmt.Fprintln(cmd.OutOrStdout(), t.Name)
			return nil
		},
	}
	sf.register(set)
	set.Flags().BoolVar(&clearFlag, "clear-flag", false, "clear the tenant's abuse flag")
	var force bool
	rm := &cobra.Command{
		Use:   "rm NAME...",
		Short: "Delete tenants and their keys (--force also destroys their sessions and snapshots)",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			for _, name := range args {
				if err := c.DeleteTenant(cmd.Context(), name, force); err != nil {
					return forItem(name, err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), name)
			}
			return nil
		},
	}
	rm.Flags().BoolVar(&force, "force", false, "also destroy the tenant's sessions and delete its snapshots")
	cmd.AddCommand(create, ls, show, set, rm)
	return cmd
}

// printTenant prints t as "Field: value" lines.
func printTenant(w io.Writer, t *client.Tenant) error {
	p := t.Policy
	templates, egress := "any", "none (no network)"
	if len(p.Templates) > 0 {
		templates = strings.Join(p.Templates, ", ")
	}
	if len(p.EgressAllow) > 0 {
		egress = strings.Join(p.EgressAllow, ", ")
	}
	cpu := "-"
	if p.MaxCPU > 0 {
		cpu = fmt.Sprintf("%g cores", p.MaxCPU)
	}
	timeout := "-"
	if p.MaxTimeoutS > 0 {
		timeout = (time.Duration(p.MaxTimeoutS) * time.Second).String()
	}
	flagged := flagText(*t)
	if t.FlaggedAt != nil {
		flagged += " (" + ago(t.FlaggedAt) + ")"
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, l := range [][2]string{
		{"Name", t.Name},
		{"Created", t.CreatedAt.Local().Format(time.RFC3339) + " (" + ago(&t.CreatedAt) + ")"},
		{"Flagged", flagged},
		{"Sessions", fmt.Sprint(t.Sessions)},
		{"CPU today", fmt.Sprintf("%.1f CPU-seconds", t.CPUSecondsToday)},
		{"Templates", templates},
		{"Max CPU", cpu},
		{"Max memory", limitText(p.MaxMemoryMB, " MiB")},
		{"Max disk", limitText(p.MaxDiskMB, " MiB")},
		{"Max pids", limitText(p.MaxPids, "")},
		{"Max timeout", timeout},
		{"Max sessions", limitText(int64(p.MaxSessions), "")},
		{"Max snapshots", limitText(int64(p.MaxSnapshots), "")},
		{"Max templates", limitText(int64(p.MaxTemplates), "")},
		{"Max volumes", limitText(int64(p.MaxVolumes), "")},
		{"Max template", limitText(p.MaxTemplateMB, " MiB")},
		{"CPU per day", limitText(p.CPUSecondsPerDay, " CPU-seconds")},
		{"Egress allow", egress},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", l[0], l[1])
	}
	return tw.Flush()
}

// limitText prints a policy limit: "-" when zero (no limit), else n and unit.
func limitText(n int64, unit string) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprint(n) + unit
}

// flagText is the tenant's abuse flag reason, "-" when not flagged.
func flagText(t client.Tenant) string {
	switch {
	case t.FlaggedAt == nil && t.FlagReason == "":
		return "-"
	case t.FlagReason == "":
		return "yes"
	}
	return t.FlagReason
}
