// Package bundle writes and opens the files of a sandbox's OCI bundle in
// its state directory, the same for every driver that runs one through
// an OCI runtime CLI (runc, runsc): the spec (config.json) and the
// agent's stdio, whose log (agent.log) is also where the runtime writes
// why a start failed.
package bundle

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	gorunc "github.com/containerd/go-runc"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// SpecFile and LogFile are the names of the spec and of the agent's log
// in a bundle directory.
const (
	SpecFile = "config.json"
	LogFile  = "agent.log"
)

// WriteSpec writes spec as dir/config.json (mode 0600: it names host
// paths), replacing an older one. dir must exist.
func WriteSpec(dir string, spec *specs.Spec) error {
	data, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, SpecFile), data, 0o600); err != nil {
		return fmt.Errorf("write bundle: %w", err)
	}
	return nil
}

// ReadSpec reads the spec WriteSpec wrote in dir.
func ReadSpec(dir string) (*specs.Spec, error) {
	data, err := os.ReadFile(filepath.Join(dir, SpecFile))
	if err != nil {
		return nil, err
	}
	var s specs.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("read bundle %s: %w", dir, err)
	}
	return &s, nil
}

// AgentStdio is the stdio of a sandbox's agent: /dev/null in, the log file
// StateDir/agent.log (appended, mode 0600) out. It is a go-runc IO
// (github.com/containerd/go-runc); Close closes both.
type AgentStdio struct {
	path         string
	devNull, log *os.File
}

// OpenAgentStdio opens the agent's stdio for a sandbox whose state
// directory is stateDir.
func OpenAgentStdio(stateDir string) (*AgentStdio, error) {
	path := filepath.Join(stateDir, LogFile)
	log, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		log.Close()
		return nil, err
	}
	return &AgentStdio{path: path, devNull: devNull, log: log}, nil
}

// Close closes both files.
func (s *AgentStdio) Close() error { return errors.Join(s.devNull.Close(), s.log.Close()) }

var _ gorunc.IO = (*AgentStdio)(nil)

// Stdin is nil: the files are set directly (Set).
func (s *AgentStdio) Stdin() io.WriteCloser { return nil }

// Stdout is nil: the files are set directly (Set).
func (s *AgentStdio) Stdout() io.ReadCloser { return nil }

// Stderr is nil: the files are set directly (Set).
func (s *AgentStdio) Stderr() io.ReadCloser { return nil }

// Set makes cmd's stdin /dev/null and its stdout and stderr the log.
func (s *AgentStdio) Set(cmd *exec.Cmd) { cmd.Stdin, cmd.Stdout, cmd.Stderr = s.devNull, s.log, s.log }

// Tail returns the last n bytes of the log (where the runtime writes why a
// start failed), trimmed; "" when it cannot be read.
func (s *AgentStdio) Tail(n int64) string {
	f, err := os.Open(s.path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		_, _ = f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(io.LimitReader(f, n))
	return strings.TrimSpace(string(b))
}
