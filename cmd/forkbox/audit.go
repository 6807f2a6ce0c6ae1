package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

// auditDetailWidth is how many characters of a record's detail the table shows.
const auditDetailWidth = 80

func newAuditCmd(g *globals) *cobra.Command {
	var f client.AuditFilter
	var since, until string
	var jsonl bool
	cmd := &cobra.Command{
		Use:   "audit [flags]",
		Short: "Show audit records, oldest first (--jsonl exports every match as JSON lines)",
		Long: `Show the append-only audit records: who did what to which session, and how it
ended. A tenant key sees its own tenant's records only; an admin key sees every
tenant's, or one tenant's with --tenant.

By default one page of at most --limit records is printed as a table; when more
match, the --after value of the next page is printed on stderr. With --jsonl
every matching record is streamed to stdout, one JSON object per line, with no
limit: the export.`,
		Example: `  forkbox audit --since 1h --kind session.
  forkbox audit --tenant acme --outcome denied --since 2024-05-01T00:00:00Z
  forkbox audit --tenant acme --jsonl > acme-audit.jsonl`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if f.Since, err = parseSince("since", since); err != nil {
				return err
			}
			if f.Until, err = parseSince("until", until); err != nil {
				return err
			}
			if jsonl && cmd.Flags().Changed("limit") {
				return fmt.Errorf("--limit does not apply to --jsonl, which exports every matching record")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if jsonl {
				return c.ExportAudit(cmd.Context(), f, cmd.OutOrStdout())
			}
			list, err := c.Audit(cmd.Context(), f)
			if err != nil {
				return err
			}
			if list.Next != 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "forkbox: more records match; next page: --after %d\n", list.Next)
			}
			return printList(cmd.OutOrStdout(), g.json, list.Records, "SEQ\tTIME\tTENANT\tSESSION\tKIND\tOUTCOME\tDETAIL",
				func(r client.AuditRecord) string {
					session := r.Session
					if session == "" {
						session = "-"
					}
					return fmt.Sprintf("%d\t%s\t%s\t%s\t%s\t%s\t%s", r.Seq, r.Time.Local().Format(time.RFC3339), r.Tenant,
						session, r.Kind, r.Outcome, detailText(r.Detail))
				})
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.Tenant, "tenant", "", "only this tenant's records (admin keys; a tenant key sees its own only)")
	fs.StringVar(&f.Session, "session", "", "only this session's records")
	fs.StringVar(&f.Kind, "kind", "", `only this kind ("exec"), or kinds starting with a prefix ending in "." ("session.")`)
	fs.StringVar(&f.Outcome, "outcome", "", "only this outcome: ok, error or denied")
	fs.StringVar(&since, "since", "", "only records from this time on: a duration back from now (1h, 30m) or an RFC 3339 time")
	fs.StringVar(&until, "until", "", "only records before this time: a duration back from now or an RFC 3339 time")
	fs.Int64Var(&f.After, "after", 0, "only records after this seq (the next page, as printed)")
	fs.IntVar(&f.Limit, "limit", 100, "most records to print (1-1000; not with --jsonl)")
	fs.BoolVar(&jsonl, "jsonl", false, "stream every matching record to stdout as JSON lines (no limit)")
	return cmd
}

// parseSince reads a time flag: a Go duration back from now ("1h") or an
// RFC 3339 time. "" is the zero time (no bound).
func parseSince(flag, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil {
		if d < 0 {
			return time.Time{}, fmt.Errorf("--%s %s: the duration must not be negative", flag, v)
		}
		return time.Now().Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("--%s %q: want a duration such as 1h or an RFC 3339 time such as 2024-05-01T12:00:00Z", flag, v)
	}
	return t, nil
}

// detailText is a record's detail as one line of compact JSON, cut to
// auditDetailWidth characters; "-" when empty.
func detailText(d map[string]any) string {
	if len(d) == 0 {
		return "-"
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(d); err != nil {
		return fmt.Sprint(d)
	}
	s := strings.TrimSuffix(b.String(), "\n")
	if utf8.RuneCountInString(s) <= auditDetailWidth {
		return s
	}
	r := []rune(s)
	return string(r[:auditDetailWidth-1]) + "…"
}
