package build

import (
	"context"
	"fmt"
	"strings"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
)

// maxScript bounds one finishing script of a COPY or ADD, in bytes.
const maxScript = 64 << 10

// batched is cmd applied to words (quoted paths) in as many commands as
// keep each below maxScript/2 bytes.
func batched(cmd string, words []string) []string {
	var out []string
	for len(words) > 0 {
		n, size := 0, len(cmd)
		for n < len(words) && (n == 0 || size+len(words[n]) < maxScript/2) {
			size += len(words[n]) + 1
			n++
		}
		out = append(out, cmd+" "+strings.Join(words[:n], " "))
		words = words[n:]
	}
	return out
}

// finishCopy runs one finishing script of a COPY or ADD (modes, links,
// owners) as root in the session.
func (r *run) finishCopy(ctx context.Context, script string) error {
	tail := &tailBuffer{max: tailBytes}
	out := node.OutputFuncs(nil, func(p []byte) error { tail.write(p); return nil }, func(p []byte) error { tail.write(p); return nil })
	res, err := r.b.node.Exec(ctx, r.session, node.ExecSpec{Argv: []string{"/bin/sh", "-c", script}, User: "root", TimeoutS: 300}, out)
	if err != nil {
		return fmt.Errorf("COPY: set modes and links: %w", err)
	}
	if res.ExitCode != 0 {
		return errdefs.InvalidField("dockerfile", "COPY: setting modes, links and owners needs /bin/sh, chmod, ln and chown in the image; they failed (exit %d): %s",
			res.ExitCode, strings.TrimSpace(tail.String()))
	}
	return nil
}
