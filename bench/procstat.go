package bench

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Readers of the host's accounting for the idle rows: /proc and the
// cgroup v1 hierarchies under /sys/fs/cgroup.

// readCgroupInt reads the integer in file of cgroup v1 hierarchy
// controller's cgroup path; a cgroup not made yet reads as 0.
func readCgroupInt(controller, path, file string) (int64, error) {
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", controller, path, file))
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("cgroup %s: %w", controller, err)
	}
	v, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("cgroup %s/%s/%s: %w", controller, path, file, err)
	}
	return v, nil
}

// procRSS returns the VmRSS of /proc/pid in bytes, 0 when unreadable.
func procRSS(pid string) int64 { return procField(pid, "status", "VmRSS:") }

// procPSS returns the proportional set size of /proc/pid in bytes (shared
// pages split between the processes sharing them), 0 when unreadable.
func procPSS(pid string) int64 { return procField(pid, "smaps_rollup", "Pss:") }

// procField returns the "key: N kB" value of /proc/pid/file in bytes, 0
// when unreadable.
func procField(pid, file, key string) int64 {
	b, err := os.ReadFile(filepath.Join("/proc", pid, file))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, key); ok {
			fields := strings.Fields(rest)
			if len(fields) > 0 {
				kb, _ := strconv.ParseInt(fields[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// memAvailable returns the host's MemAvailable (/proc/meminfo), in bytes.
func memAvailable() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, fmt.Errorf("meminfo: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			fields := strings.Fields(rest)
			if len(fields) > 0 {
				kb, err := strconv.ParseInt(fields[0], 10, 64)
				if err == nil {
					return kb << 10, nil
				}
			}
		}
	}
	return 0, errors.New("meminfo: no MemAvailable")
}

// clockTick is the kernel's USER_HZ, the unit of /proc CPU times (100 on
// every Linux architecture Go supports).
const clockTick = 100

// hostBusy returns the CPU-seconds all CPUs spent not idle since boot
// (/proc/stat: user, nice, system, irq, softirq, steal; not idle and
// iowait).
func hostBusy() (float64, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, errors.New("/proc/stat is empty")
	}
	fields := strings.Fields(sc.Text())
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0, errors.New("/proc/stat: no cpu line")
	}
	var busy float64
	for i, v := range fields[1:9] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		x, _ := strconv.ParseFloat(v, 64)
		busy += x
	}
	return busy / clockTick, nil
}

// selfCPU returns this process's CPU-seconds, user and system, with those
// of the children it waited for (/proc/self/stat utime, stime, cutime,
// cstime).
func selfCPU() float64 {
	ticks, _ := statTicks("self", true)
	return ticks / clockTick
}

// statTicks returns utime+stime of /proc/pid/stat (and cutime+cstime
// when children), in clock ticks.
func statTicks(pid string, children bool) (float64, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "stat"))
	if err != nil {
		return 0, false
	}
	// The command name (field 2) may hold spaces; fields follow its ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(s[i+1:]) // fields[0] is field 3 (state)
	if len(fields) < 15 {
		return 0, false
	}
	last := 13 // utime (14), stime (15)
	if children {
		last = 15 // cutime (16), cstime (17)
	}
	var t float64
	for _, v := range fields[11:last] {
		x, _ := strconv.ParseFloat(v, 64)
		t += x
	}
	return t, true
}

// procSet is CPU-seconds by pid, and the PSS summed, of a set of
// processes.
type procSet struct {
	cpu map[string]float64
	pss int64
}

// runtimeProcs finds the runsc processes of the private daemon's gVisor
// sandboxes (their command line names runsc and the daemon's data
// directory) and returns their CPU time and PSS; empty for runc, or
// without a private daemon.
func runtimeProcs(dataDir, isolation string) procSet {
	set := procSet{cpu: map[string]float64{}}
	if dataDir == "" || isolation != driverGVisor {
		return set
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return set
	}
	for _, e := range entries {
		pid := e.Name()
		if pid[0] < '0' || pid[0] > '9' {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
		if err != nil || !strings.Contains(string(cmd), "runsc") || !strings.Contains(string(cmd), dataDir) {
			continue
		}
		if t, ok := statTicks(pid, false); ok {
			set.cpu[pid] = t / clockTick
			set.pss += procPSS(pid)
		}
	}
	return set
}

// round3 rounds x to 3 decimals (small percentages).
func round3(x float64) float64 { return math.Round(x*1000) / 1000 }
