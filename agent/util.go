package agent

import (
	"os"
	"sort"

	"github.com/creack/pty"

	"github.com/forkbox/forkbox/internal/envdpb/processpb"
)

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func resizePTY(master *os.File, sz *processpb.PTY_Size) error {
	return pty.Setsize(master, &pty.Winsize{Cols: uint16(sz.GetCols()), Rows: uint16(sz.GetRows())})
}
