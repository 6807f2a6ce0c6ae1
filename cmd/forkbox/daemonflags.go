package main

import (
	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/defaults"
)

// rootLong is the root command's help: what forkbox is and how every
// command finds its daemon and key.
var rootLong = `Run untrusted code in isolated, forkable sandboxes.

Every command but serve, down and bench talks to a forkbox daemon:
  --url or ` + client.EnvURL + `          the daemon (default ` + defaults.URL + `)
  --api-key or ` + client.EnvAPIKey + `  its API key; without one, a local daemon's key
                                file is read (--api-key-file, default
                                ` + defaults.KeyFile + `, readable by root only)

Exit status: 0 on success; a command's own status for run and exec (127
when it does not exist in the sandbox); 125 when forkbox itself failed
(a bad argument, an unknown session, an unreachable daemon, a refused key).`

// registerDaemonFlags adds --url and --api-key, which every command that
// talks to a daemon reads, to root's persistent flags.
func (g *globals) registerDaemonFlags(root *cobra.Command) {
	root.PersistentFlags().StringVar(&g.url, "url", "", "the daemon's URL (default: "+client.EnvURL+", else "+defaults.URL+")")
	root.PersistentFlags().StringVar(&g.apiKey, "api-key", "", "the API key (default: "+client.EnvAPIKey+", else the key file of a local daemon; a flag shows in ps: prefer "+client.EnvAPIKey+")")
}

// client returns the client of the daemon the flags and the environment
// name (client.Open), its errors naming the flag a setting came from.
func (g *globals) client() (*client.Client, error) {
	o := client.Options{URL: g.url, APIKey: g.apiKey, KeyFile: g.keyFile}
	if g.url != "" {
		o.URLSource = "the --url flag"
	}
	if g.apiKey != "" {
		o.KeySource = "the --api-key flag"
	}
	return client.Open(o)
}
