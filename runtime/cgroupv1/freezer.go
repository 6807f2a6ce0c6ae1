package cgroupv1

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// The states of a v1 freezer cgroup (freezer.state).
const (
	Thawed   = "THAWED"
	Freezing = "FREEZING"
	Frozen   = "FROZEN"
)

// FreezerState returns sandbox id's freezer state: Thawed, Freezing or
// Frozen. An error wrapping os.ErrNotExist when the sandbox has no
// freezer cgroup.
func (c *Cgroups) FreezerState(id string) (string, error) {
	p, err := c.path("freezer", id)
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(p, "freezer.state"))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// SetFreezer writes state (Frozen or Thawed) to sandbox id's freezer and
// waits until the kernel reports it, polling with a short backoff; it
// gives up after 2 s with an error naming the state the freezer is stuck
// in. Callers order the changes of one sandbox themselves.
func (c *Cgroups) SetFreezer(id, state string) error {
	p, err := c.path("freezer", id)
	if err != nil {
		return err
	}
	file := filepath.Join(p, "freezer.state")
	deadline := time.Now().Add(2 * time.Second)
	for delay := 50 * time.Microsecond; ; delay = min(delay*2, 10*time.Millisecond) {
		if err := os.WriteFile(file, []byte(state), 0); err != nil {
			return err
		}
		got, err := c.FreezerState(id)
		if err != nil {
			return err
		}
		if got == state {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("freezer of %s stuck in %s, wanted %s", id, got, state)
		}
		time.Sleep(delay)
	}
}
