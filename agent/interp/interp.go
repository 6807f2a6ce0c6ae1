// Package interp holds the code interpreter's in-sandbox programs that
// forkbox-agent runs: the Python bridge (bridge.py), which starts one
// IPython kernel through jupyter_client over the ipc transport and speaks
// JSON lines (E2B's /execute line types) on its stdin and stdout, and the
// chart module (charts.py) it loads into each kernel, which turns a
// matplotlib figure into E2B's chart JSON under the "e2b/chart" MIME type.
//
// The HTTP service under the agent's /code prefix that supervises bridges
// is not written yet; see the package's tests for the bridge's protocol.
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
