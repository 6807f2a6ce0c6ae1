// Command forkbox-agent is the guest agent: init of every sandbox and server
// of the envd protocol on the listening socket inherited as fd 3.
package main

import (
	"os"

	"github.com/forkbox/forkbox/agent"
	"github.com/forkbox/forkbox/runtime"
)

func main() { os.Exit(agent.Main(runtime.AgentListenFD)) }
