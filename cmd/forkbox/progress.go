package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// isTerminal reports whether w is a terminal (a *os.File whose termios
// can be read).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}

// progressLine is a single status line redrawn in place on a terminal
// ("\r", the text, erase to the end of the line), at most every
// progressEvery; Done erases it. It is safe for concurrent use.
type progressLine struct {
	w     io.Writer
	mu    sync.Mutex
	last  time.Time
	shown bool
}

// progressEvery is how often a progressLine redraws, at most.
const progressEvery = 100 * time.Millisecond

// show draws text now when force, else when progressEvery has passed
// since the last draw.
func (p *progressLine) show(text string, force bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !force && time.Since(p.last) < progressEvery {
		return
	}
	p.last = time.Now()
	p.shown = true
	fmt.Fprintf(p.w, "\r%s\x1b[K", text)
}

// done erases the line, if it was drawn.
func (p *progressLine) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shown {
		fmt.Fprint(p.w, "\r\x1b[K")
		p.shown = false
	}
}

// uploadText is the progress line of an upload of what (a file name)
// with sent of total bytes sent (total -1 when not known), or, once done,
// what the daemon does with it.
func uploadText(what string, sent, total int64, done bool) string {
	switch {
	case done:
		return fmt.Sprintf("%s: sent %s; unpacking the image's layers on the daemon...", what, bytesText(sent))
	case total > 0:
		return fmt.Sprintf("%s: uploading %s of %s (%d%%)", what, bytesText(sent), bytesText(total), sent*100/total)
	}
	return fmt.Sprintf("%s: uploading %s", what, bytesText(sent))
}
