// Command forkbox-agent is the guest agent: init of every sandbox and server
// of the envd protocol on the listening socket inherited as fd 3 (or bound
// at FORKBOX_AGENT_LISTEN). Run as "forkbox-agent kill-group PGID SIGNAL" it
// signals a process group from inside the sandbox instead (for drivers that
// cannot reach its processes from the host).
package main

import (
	"fmt"
	"os"

	"github.com/forkbox/forkbox/agent"
	"github.com/forkbox/forkbox/guest/wire"
	"github.com/forkbox/forkbox/runtime"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == wire.KillGroupCommand {
		os.Exit(agent.KillGroupMain(os.Args[2:]))
	}
	// Limits the runtime could not set from outside, before anything runs.
	rl, err := runtime.ParseRlimits(os.Getenv(runtime.AgentRlimitsEnv))
	if err == nil {
		err = rl.Apply()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "forkbox-agent: resource limits:", err)
		os.Exit(2)
	}
	os.Exit(agent.Main(runtime.AgentListenFD))
}
