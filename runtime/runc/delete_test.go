package runc

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestAlive: a running process with its own start time is alive; the same
// pid with another start time (a reused pid) and a pid with no process
// are not.
func TestAlive(t *testing.T) {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Skip("no /proc")
	}
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	start, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	pid := os.Getpid()
	if !alive(pid, start) {
		t.Fatal("this process is not alive")
	}
	if alive(pid, start+1) {
		t.Fatal("a reused pid counts as the same process")
	}
	if alive(1<<22+1, 0) { // above pid_max's limit
		t.Fatal("a pid with no process is alive")
	}
}
