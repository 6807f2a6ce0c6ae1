package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// KillGroupMain is the agent binary run as "kill-group PGID SIGNAL" inside a
// sandbox by a driver that cannot see the sandbox's processes from the host
// (gVisor: they live in its Sentry). It counts the processes whose process
// group is PGID (from /proc/*/stat), sends SIGNAL to the group with
// kill(-PGID), and prints the count on stdout. It refuses groups 0 and 1
// (the agent's own). Exit status 0, or 2 for bad arguments or a failed kill
// other than "no such process".
func KillGroupMain(args []string) int {
	if len(args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: kill-group PGID SIGNAL")
		return 2
	}
	pgid, err1 := strconv.Atoi(args[0])
	sig, err2 := strconv.Atoi(args[1])
	if err1 != nil || err2 != nil || pgid <= 1 || sig < 0 || sig > 64 {
		fmt.Fprintln(os.Stderr, "kill-group: PGID must be > 1 and SIGNAL 0-64")
		return 2
	}
	n := countGroup(pgid)
	if err := syscall.Kill(-pgid, syscall.Signal(sig)); err != nil {
		if err == syscall.ESRCH {
			fmt.Println(0)
			return 0
		}
		fmt.Fprintln(os.Stderr, "kill-group:", err)
		return 2
	}
	fmt.Println(n)
	return 0
}

// countGroup counts the processes in /proc whose process group is pgid.
func countGroup(pgid int) int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	n := 0
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// Fields after the command name, which is in parentheses and may
		// hold anything: state ppid pgrp ...
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) >= 3 && f[2] == strconv.Itoa(pgid) {
			n++
		}
	}
	return n
}
