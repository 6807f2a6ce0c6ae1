package main

import (
	"bufio"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/forkbox/forkbox/client"
)

// pullFlags are template import's flags of a pull.
type pullFlags struct {
	platform       string
	insecure       []string
	registryConfig string
	username       string
	passwordStdin  bool
}

// pullFlagNames are the flags register adds.
var pullFlagNames = []string{"platform", "insecure-registry", "registry-config", "username", "password-stdin"}

func (f *pullFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.platform, "platform", "", "the platform to pull from a multi-platform image, os/arch[/variant] (default: the daemon host's)")
	fs.StringArrayVar(&f.insecure, "insecure-registry", nil, "a registry (host or host:port) the daemon may pull from over plain HTTP (repeatable; localhost always may)")
	fs.StringVar(&f.registryConfig, "registry-config", "", "a docker config directory (holding config.json) to take registry credentials from (default: DOCKER_CONFIG, else ~/.docker)")
	fs.StringVar(&f.username, "username", "", "the registry user name (with --password-stdin)")
	fs.BoolVar(&f.passwordStdin, "password-stdin", false, "read the registry password (or token) from standard input")
}

// changed reports whether any pull flag was given.
func (f *pullFlags) changed(cmd *cobra.Command) bool {
	for _, n := range pullFlagNames {
		if cmd.Flags().Changed(n) {
			return true
		}
	}
	return false
}

// auth returns the credential for ref the flags give: --username and the
// password on stdin, else the docker config's (nil: none).
func (f *pullFlags) auth(stdin io.Reader, ref string) (*client.RegistryAuth, error) {
	switch {
	case f.passwordStdin && f.username == "":
		return nil, fmt.Errorf("--password-stdin needs --username")
	case f.username != "" && !f.passwordStdin:
		return nil, fmt.Errorf("--username needs --password-stdin (a password is never a flag: it would show in ps)")
	case f.username != "":
		pw, err := bufio.NewReader(io.LimitReader(stdin, 64<<10)).ReadString('\n')
		if err != nil && err != io.EOF {
			return nil, fmt.Errorf("read the password from standard input: %w", err)
		}
		pw = strings.TrimRight(pw, "\r\n")
		if pw == "" {
			return nil, fmt.Errorf("--password-stdin: standard input holds no password")
		}
		return &client.RegistryAuth{Username: f.username, Password: pw}, nil
	}
	return client.RegistryAuthFor(ref, f.registryConfig)
}

// pullTemplate has the daemon pull ref as template name, showing its
// progress on standard error (one line on a terminal, a line per layer
// otherwise) unless quiet.
func pullTemplate(cmd *cobra.Command, c *client.Client, name, ref string, startCmd, quiet bool, f *pullFlags) (*client.Template, error) {
	auth, err := f.auth(cmd.InOrStdin(), ref)
	if err != nil {
		return nil, err
	}
	o := client.PullOptions{Platform: f.platform, InsecureRegistries: f.insecure, Auth: auth, StartCmd: startCmd}
	if !quiet {
		p := &pullProgress{ref: ref, w: cmd.ErrOrStderr()}
		if isTerminal(cmd.ErrOrStderr()) {
			p.line = &progressLine{w: cmd.ErrOrStderr()}
			defer p.line.done()
		}
		o.Progress = p.event
	}
	return c.PullTemplate(cmd.Context(), name, ref, o)
}

// pullProgress shows a pull's events: on one redrawn line (line set) or
// as a line per step.
type pullProgress struct {
	ref    string
	w      io.Writer
	line   *progressLine
	sizes  map[int]int64 // by layer index
	done   map[int]int64
	cached map[int]bool
	total  int64
}

// event takes one event of the pull.
func (p *pullProgress) event(e client.PullEvent) {
	switch e.Kind {
	case "resolved":
		p.sizes, p.done, p.cached = map[int]int64{}, map[int]int64{}, map[int]bool{}
		for _, l := range e.Layers {
			p.sizes[l.Index] = l.Size
			p.total += l.Size
		}
		if p.line == nil {
			fmt.Fprintf(p.w, "%s: %s (%s), %d layers, %s\n", p.ref, e.Digest, e.Platform, len(e.Layers), bytesText(p.total))
		}
	case "layer":
		if e.Layer == nil || p.sizes == nil {
			return
		}
		l := e.Layer
		p.done[l.Index] = l.Done
		if l.Complete && l.Cached {
			p.cached[l.Index] = true
		}
		if p.line == nil {
			if l.Complete {
				how := "downloaded"
				if l.Cached {
					how = "cached"
				}
				fmt.Fprintf(p.w, "  layer %d/%d %s %s %s\n", l.Index+1, len(p.sizes), shortDigest(l.Digest), bytesText(l.Size), how)
			}
			return
		}
		p.line.show(p.text(), false)
	case "unpacking":
		if p.line == nil {
			fmt.Fprintf(p.w, "%s: unpacking the layers on the daemon...\n", p.ref)
			return
		}
		p.line.show(fmt.Sprintf("%s: unpacking %d layers on the daemon...", p.ref, len(p.sizes)), true)
	}
}

// text is the progress line: layers complete, bytes, cached.
func (p *pullProgress) text() string {
	var got int64
	complete := 0
	for i, size := range p.sizes {
		got += p.done[i]
		if p.done[i] >= size {
			complete++
		}
	}
	s := fmt.Sprintf("%s: %d/%d layers, %s of %s", p.ref, complete, len(p.sizes), bytesText(got), bytesText(p.total))
	if p.total > 0 {
		s += fmt.Sprintf(" (%d%%)", got*100/p.total)
	}
	if n := len(p.cached); n > 0 {
		s += fmt.Sprintf(", %d cached", n)
	}
	return s
}

// shortDigest is a digest's algorithm and first 12 hex digits.
func shortDigest(d string) string {
	if alg, hex, ok := strings.Cut(d, ":"); ok && len(hex) > 12 {
		return alg + ":" + hex[:12]
	}
	return d
}
