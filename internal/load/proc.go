package load

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nodetrust/nodetrust/internal/cputime"
)

// procUsage is one sample of a process's CPU time and memory.
type procUsage struct {
	CPU time.Duration // utime + stime, all threads
	HWM int64         // VmHWM: peak resident set, bytes
	RSS int64         // VmRSS: current resident set, bytes
}

// sampleProc reads /proc/<pid>/stat and /proc/<pid>/status.
func sampleProc(pid int) (procUsage, error) {
	var u procUsage
	var err error
	if u.CPU, err = cputime.OfProcess(pid); err != nil {
		return u, fmt.Errorf("read the server's CPU time: %w", err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, fmt.Errorf("read the server's memory: %w", err)
	}
	u.HWM, u.RSS = parseStatusMem(b)
	return u, nil
}

// parseStatusMem returns VmHWM and VmRSS in bytes from the content of
// /proc/<pid>/status (0 for a field that is missing).
func parseStatusMem(b []byte) (hwm, rss int64) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmHWM" && k != "VmRSS") {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			n *= 1024
		}
		if k == "VmHWM" {
			hwm = n
		} else {
			rss = n
		}
	}
	return hwm, rss
}

// sampleProcs is sampleProc summed over several processes (the replicas
// of one control plane): CPU time, RSS and the peaks each reached.
func sampleProcs(pids []int) (procUsage, error) {
	var sum procUsage
	for _, pid := range pids {
		u, err := sampleProc(pid)
		if err != nil {
			return procUsage{}, fmt.Errorf("process %d: %w", pid, err)
		}
		sum.CPU += u.CPU
		sum.RSS += u.RSS
		sum.HWM += u.HWM
	}
	return sum, nil
}

// resetPeaks is resetPeak of every process of pids.
func resetPeaks(pids []int) error {
	for _, pid := range pids {
		if err := resetPeak(pid); err != nil {
			return err
		}
	}
	return nil
}

// resetPeak resets the process's VmHWM to its current RSS (writing 5 to
// /proc/<pid>/clear_refs), so that the next reading is the peak of one
// phase, not of the process's life.
func resetPeak(pid int) error {
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0); err != nil {
		return fmt.Errorf("reset the peak RSS of process %d: %w", pid, err)
	}
	return nil
}

// raiseNoFile raises RLIMIT_NOFILE's soft limit to the hard limit, and,
// when the hard limit is below need and the process may, the hard limit
// to need. A child started afterwards (fleetd) inherits the result.
func raiseNoFile(need uint64) (syscall.Rlimit, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return lim, fmt.Errorf("read RLIMIT_NOFILE: %w", err)
	}
	want := lim
	want.Cur = want.Max
	if want.Max < need {
		grown := want
		grown.Max, grown.Cur = need, need
		if b, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
			if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil && n < need {
				grown.Max, grown.Cur = n, n
			}
		}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &grown); err == nil {
			return grown, nil
		}
	}
	// Setrlimit also tells os/exec not to restore the original soft limit
	// in children.
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
		return lim, fmt.Errorf("raise RLIMIT_NOFILE to %d: %w", want.Max, err)
	}
	return want, nil
}

// Machine describes where a run happened.
type Machine struct {
	CPUModel   string `json:"cpu_model"`
	CPUs       int    `json:"cpus"`
	MemTotal   int64  `json:"mem_total_bytes"`
	Kernel     string `json:"kernel"`
	GoVersion  string `json:"go_version"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	Hostname   string `json:"hostname"`
}

func describeMachine() Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0)}
	m.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				n, _ := strconv.ParseInt(f[1], 10, 64)
				m.MemTotal = n * 1024
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// findListenerPID finds the local process listening on addr's TCP port,
// through /proc/net/tcp{,6} and the processes' open sockets. It needs the
// rights to read other processes' fd folders (root, or the same user).
func findListenerPID(addr string) (int, error) {
	_, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, fmt.Errorf("find the server process: %w", err)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return 0, fmt.Errorf("find the server process: port %q: %w", portText, err)
	}
	inodes := map[string]bool{}
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fl := strings.Fields(line)
			// local_address is "HEX_IP:HEX_PORT"; st 0A is LISTEN.
			if len(fl) < 10 || fl[3] != "0A" {
				continue
			}
			_, p, ok := strings.Cut(fl[1], ":")
			if n, err := strconv.ParseUint(p, 16, 16); ok && err == nil && n == port {
				inodes["socket:["+fl[9]+"]"] = true
			}
		}
	}
	if len(inodes) == 0 {
		return 0, fmt.Errorf("find the server process: nothing listens on port %d here", port)
	}
	fds, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range fds {
		target, err := os.Readlink(fd)
		if err != nil || !inodes[target] {
			continue
		}
		pid, err := strconv.Atoi(strings.Split(fd, "/")[2])
		if err == nil {
			return pid, nil
		}
	}
	return 0, fmt.Errorf("find the server process: no readable process holds the socket listening on port %d (pass --server-pid)", port)
}
