package cputime

import (
	"os"
	"testing"
	"time"
)

// TestProcessCountsWork checks that CPU time spent spinning shows in
// Process: a reading that stood still would make every benchmark's
// cpu-ns/op and the load tool's own CPU zero.
func TestProcessCountsWork(t *testing.T) {
	before := Process()
	deadline := time.Now().Add(10 * time.Second)
	for n := 0; Process()-before < 20*time.Millisecond; n++ {
		if time.Now().After(deadline) {
			t.Fatalf("10 s of spinning counted %s of CPU time", Process()-before)
		}
		_ = n * n
	}
}

func TestParseStat(t *testing.T) {
	// A command name with a space and a parenthesis; utime 250, stime 50.
	stat := "1234 (fleetd (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 8 0 100 0 0\n"
	got, err := parseStat([]byte(stat))
	if err != nil {
		t.Fatal(err)
	}
	if want := 3 * time.Second; got != want {
		t.Errorf("CPU %s, want %s", got, want)
	}
	if _, err := parseStat([]byte("1234 (x) S 1")); err == nil {
		t.Error("a short stat line parsed")
	}
}

// TestOfProcessReadsThisProcess: this process's CPU time read from /proc
// grows with work, as Process's does.
func TestOfProcessReadsThisProcess(t *testing.T) {
	before, err := OfProcess(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		now, err := OfProcess(os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if now-before >= 20*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s of spinning counted %s in /proc", now-before)
		}
	}
	if _, err := OfProcess(-1); err == nil {
		t.Error("OfProcess(-1) read something")
	}
}
