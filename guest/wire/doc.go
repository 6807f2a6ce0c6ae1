// Package wire holds the names and message types that the host and the
// guest agent (forkbox-agent, package agent) share beyond E2B's envd
// protocol: environment variables the agent reads at start, forkbox's own
// request headers and response trailers on envd calls, and the JSON bodies
// of the agent's forkbox-only endpoints and control file.
//
// Both sides import it; nothing else is in it. The host (the sandbox
// manager, the drivers) therefore never imports the agent binary's
// package, and a change to a name here is a change to the protocol
// between a daemon and the agents it started (including agents restored
// from memory checkpoints made by an older daemon): keep names and JSON
// field names stable.
package wire
