package load

import (
	"os"
	"testing"
	"time"
)

func TestParseStatusMem(t *testing.T) {
	hwm, rss := parseStatusMem([]byte("Name:\tfleetd\nVmHWM:\t   2048 kB\nVmRSS:\t   1024 kB\nThreads:\t8\n"))
	if hwm != 2048*1024 || rss != 1024*1024 {
		t.Errorf("VmHWM %d, VmRSS %d", hwm, rss)
	}
}

func TestSampleSelf(t *testing.T) {
	u, err := sampleProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if u.RSS <= 0 || u.HWM < u.RSS {
		t.Errorf("RSS %d, peak %d", u.RSS, u.HWM)
	}
}

// TestSampleSeveral sums the processes of several replicas: this process
// and its parent (go test), each read alone before and after.
func TestSampleSeveral(t *testing.T) {
	pids := []int{os.Getpid(), os.Getppid()}
	var lo procUsage
	for _, pid := range pids {
		u, err := sampleProc(pid)
		if err != nil {
			t.Fatal(err)
		}
		lo.CPU += u.CPU
	}
	sum, err := sampleProcs(pids)
	if err != nil {
		t.Fatal(err)
	}
	var hi procUsage
	for _, pid := range pids {
		u, err := sampleProc(pid)
		if err != nil {
			t.Fatal(err)
		}
		hi.CPU += u.CPU
		if u.RSS > sum.RSS {
			t.Errorf("process %d alone has RSS %d, above the sum %d", pid, u.RSS, sum.RSS)
		}
	}
	if sum.CPU < lo.CPU || sum.CPU > hi.CPU {
		t.Errorf("summed CPU %s, want between %s and %s", sum.CPU, lo.CPU, hi.CPU)
	}
	if _, err := sampleProcs([]int{os.Getpid(), -1}); err == nil {
		t.Error("a process that does not exist was sampled")
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i))
	}
	for q, want := range map[float64]time.Duration{0.5: 50, 0.9: 90, 0.99: 99, 1: 100} {
		if got := percentile(d, q); got != want {
			t.Errorf("p%v = %d, want %d", q*100, got, want)
		}
	}
	if percentile(nil, 0.5) != 0 {
		t.Error("percentile of nothing")
	}
	if got := percentile(d[:1], 0.99); got != 1 {
		t.Errorf("p99 of one value = %d", got)
	}
}
