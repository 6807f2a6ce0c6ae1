// Package interp is forkbox-agent's code-execution service: E2B's
// code-interpreter protocol (@e2b/code-interpreter 2.8.0's port 49999:
// /execute streaming JSON lines, /contexts, /health), served under the
// agent's /code prefix (Service.Handler), with contexts that each keep an
// interpreter between calls.
//
// Python contexts run a real IPython kernel behind the Python bridge
// (bridge.py), which drives it through jupyter_client over the ipc
// transport and speaks JSON lines on its stdin and stdout; the chart
// module (charts.py) it loads into each kernel turns a matplotlib figure
// into E2B's chart JSON under the "e2b/chart" MIME type. JavaScript
// contexts run a node process with the driver in driver.js, bash contexts
// a bash process (languages.go); both write what the cell prints to their
// own stdout and stderr, cut into cells by a random end marker
// (stream.go). The agent starts every interpreter as the session's
// default user through a Launcher.
package interp

import _ "embed"

// BridgeSource is the Python bridge's source: run it as
// `python3 -I -c BridgeSource CWD ChartsSource`.
//
//go:embed bridge.py
var BridgeSource string

// ChartsSource is the chart module's source, passed to the bridge as its
// second argument.
//
//go:embed charts.py
var ChartsSource string
