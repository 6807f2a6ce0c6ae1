package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/forkbox/forkbox/client"
)

// printTemplate writes t as `forkbox template inspect` shows it: one
// "key: value" line per field that is set.
func printTemplate(w io.Writer, t *client.Template) {
	line := func(k, v string) {
		if v != "" {
			fmt.Fprintf(w, "%-14s %s\n", k+":", v)
		}
	}
	line("name", t.Name)
	line("source", t.Source)
	line("alias of", t.AliasOf)
	line("digest", t.Digest)
	line("size", bytesText(t.SizeBytes))
	line("layers", fmt.Sprint(t.Layers))
	line("user", t.User)
	line("workdir", t.Workdir)
	for _, e := range t.Env {
		line("env", e)
	}
	switch {
	case len(t.StartCmd) > 0:
		line("start", strings.Join(t.StartCmd, " ")+" (in the background in every new session)")
	case len(t.Cmd) > 0:
		line("cmd", strings.Join(t.Cmd, " ")+" (not started)")
	}
	if len(t.ReadyCmd) > 0 {
		timeout := t.ReadyTimeoutS
		if timeout == 0 {
			timeout = 30
		}
		line("ready", fmt.Sprintf("%s (a create waits until it exits 0, at most %d s)", strings.Join(t.ReadyCmd, " "), timeout))
	}
	if t.WarmSnapshot != "" {
		line("warm", t.WarmSnapshot+" (a memory snapshot of the started server: a gVisor create that asks for no env, user, workdir, network or volumes restores it)")
	}
	line("created", t.CreatedAt)
}

// yesOrDash is "yes" for true, "-" for false (a list's flag column).
func yesOrDash(b bool) string {
	if b {
		return "yes"
	}
	return "-"
}
