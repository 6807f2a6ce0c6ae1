// Package build makes templates from Dockerfiles. The Dockerfile is
// parsed by BuildKit's own parser (github.com/moby/buildkit's
// frontend/dockerfile/parser and instructions); each step that changes
// files (RUN, COPY, ADD of context files, WORKDIR) runs in a real forkbox
// sandbox, made through the node.Node every other session is made
// through, and its result is a snapshot cached by a key of its parent,
// its instruction and its inputs' digests; the finished template is
// installed into the catalog at once (template.Catalog.InstallBuilt).
package build

import (
	"bytes"
	"errors"
	"fmt"
	"strings"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"

	"github.com/forkbox/forkbox/errdefs"
)

// maxDockerfile bounds a Dockerfile, in bytes.
const maxDockerfile = 1 << 20

// maxSteps bounds a Dockerfile's instructions.
const maxSteps = 200

// File is a parsed Dockerfile: one stage (its FROM) and the
// instructions after it.
type File struct {
	// From is the FROM's image as written (ARGs before FROM not yet
	// expanded); FromLine its line.
	From     string
	FromLine int
	// MetaArgs are the ARGs before FROM (they may be used in FROM).
	MetaArgs []*instructions.ArgCommand
	// Instrs are the instructions after FROM, in order.
	Instrs []Instr
}

// Instr is one instruction of a File: the line it starts on, its text as
// written (continuation lines joined) and BuildKit's typed command
// (*instructions.RunCommand, *instructions.CopyCommand, ...).
type Instr struct {
	Line int
	Text string
	Cmd  instructions.Command
}

// Parse parses dockerfile. It accepts one stage: FROM (no --platform, no
// AS naming a stage for a later one) followed by RUN, COPY, ADD, ENV,
// ARG, WORKDIR, USER, CMD, ENTRYPOINT, HEALTHCHECK (the template's ready
// check: readyCheck), and LABEL, EXPOSE and
// MAINTAINER (kept by nothing: forkbox templates have no labels or
// exposed-port list). Errors are ErrInvalidArgument naming the field
// "dockerfile" and the line: a syntax error, an instruction forkbox does
// not build (a second FROM, SHELL, VOLUME, ONBUILD,
// STOPSIGNAL), a flag it does not support (RUN --mount/--network, COPY
// --from, ADD of a git source or a URL other than http(s), ADD
// --checksum/--link, COPY --chmod), heredocs, or more than 200
// instructions or 1 MiB.
func Parse(dockerfile []byte) (*File, error) {
	if len(dockerfile) > maxDockerfile {
		return nil, errdefs.InvalidField("dockerfile", "longer than %d bytes", maxDockerfile)
	}
	res, err := parser.Parse(bytes.NewReader(dockerfile))
	if err != nil {
		return nil, lineError(err, 0)
	}
	f := &File{}
	for _, n := range res.AST.Children {
		line := n.StartLine
		if len(f.Instrs)+len(f.MetaArgs) >= maxSteps {
			return nil, errdefs.InvalidField("dockerfile", "line %d: more than %d instructions", line, maxSteps)
		}
		if len(n.Heredocs) > 0 {
			return nil, errdefs.InvalidField("dockerfile", "line %d: heredocs are not supported", line)
		}
		v, err := instructions.ParseInstruction(n)
		if err != nil {
			return nil, lineError(err, line)
		}
		if st, ok := v.(*instructions.Stage); ok {
			if f.FromLine != 0 {
				return nil, errdefs.InvalidField("dockerfile", "line %d: a second FROM: multi-stage builds are not supported", line)
			}
			if st.Platform != "" {
				return nil, errdefs.InvalidField("dockerfile", "line %d: FROM --platform is not supported", line)
			}
			f.From, f.FromLine = st.BaseName, line
			continue
		}
		if a, ok := v.(*instructions.ArgCommand); ok && f.FromLine == 0 {
			f.MetaArgs = append(f.MetaArgs, a)
			continue
		}
		if f.FromLine == 0 {
			return nil, errdefs.InvalidField("dockerfile", "line %d: %s before FROM", line, strings.ToUpper(n.Value))
		}
		cmd, ok := v.(instructions.Command)
		if !ok {
			return nil, errdefs.InvalidField("dockerfile", "line %d: %s is not supported", line, strings.ToUpper(n.Value))
		}
		if err := supported(cmd); err != nil {
			return nil, errdefs.InvalidField("dockerfile", "line %d: %v", line, err)
		}
		f.Instrs = append(f.Instrs, Instr{Line: line, Text: strings.TrimSpace(n.Original), Cmd: cmd})
	}
	if f.FromLine == 0 {
		return nil, errdefs.InvalidField("dockerfile", "no FROM instruction")
	}
	return f, nil
}

// supported says why forkbox does not build cmd (nil when it does).
func supported(cmd instructions.Command) error {
	switch c := cmd.(type) {
	case *instructions.RunCommand:
		if len(c.FlagsUsed) > 0 {
			return fmt.Errorf("RUN --%s is not supported", c.FlagsUsed[0])
		}
		if len(c.Files) > 0 {
			return fmt.Errorf("RUN with a heredoc is not supported")
		}
	case *instructions.CopyCommand:
		if c.From != "" {
			return fmt.Errorf("COPY --from is not supported (one stage only)")
		}
		if c.Chmod != "" || c.Link || c.Parents || len(c.ExcludePatterns) > 0 {
			return fmt.Errorf("COPY supports only --chown")
		}
		if len(c.SourceContents) > 0 {
			return fmt.Errorf("COPY with a heredoc is not supported")
		}
	case *instructions.AddCommand:
		if c.Link || len(c.ExcludePatterns) > 0 || c.Checksum != "" || c.KeepGitDir != nil || c.Unpack != nil {
			return fmt.Errorf("ADD supports only --chown and --chmod")
		}
		if _, err := parseChmod(c.Chmod); err != nil {
			return fmt.Errorf("ADD %w", err)
		}
		if len(c.SourceContents) > 0 {
			return fmt.Errorf("ADD with a heredoc is not supported")
		}
		for _, s := range c.SourcePaths {
			gitRepo := strings.HasPrefix(s, "git@") || isURL(s) && strings.HasSuffix(strings.SplitN(s, "#", 2)[0], ".git")
			if gitRepo || strings.Contains(s, "://") && !isURL(s) {
				return fmt.Errorf("ADD of %s is not supported: only http and https URLs and files of the context", s)
			}
		}
	case *instructions.CmdCommand, *instructions.EntrypointCommand:
		var sd instructions.ShellDependantCmdLine
		if cc, ok := c.(*instructions.CmdCommand); ok {
			sd = cc.ShellDependantCmdLine
		} else {
			sd = c.(*instructions.EntrypointCommand).ShellDependantCmdLine
		}
		if len(sd.Files) > 0 {
			return fmt.Errorf("%s with a heredoc is not supported", strings.ToUpper(cmd.Name()))
		}
	case *instructions.HealthCheckCommand:
		return checkHealth(c)
	case *instructions.EnvCommand, *instructions.ArgCommand, *instructions.WorkdirCommand, *instructions.UserCommand,
		*instructions.LabelCommand, *instructions.ExposeCommand, *instructions.MaintainerCommand:
	default:
		return fmt.Errorf("%s is not supported", strings.ToUpper(cmd.Name()))
	}
	return nil
}

// lineError is a parser error as a "dockerfile" field error naming its
// line (the parser's own location when it has one, else line).
func lineError(err error, line int) error {
	var le *parser.LocationError
	if errors.As(err, &le) && len(le.Locations) > 0 && len(le.Locations[0]) > 0 {
		line = le.Locations[0][0].Start.Line
	}
	msg := err.Error()
	if line > 0 {
		return errdefs.InvalidField("dockerfile", "line %d: %s", line, msg)
	}
	return errdefs.InvalidField("dockerfile", "%s", msg)
}
