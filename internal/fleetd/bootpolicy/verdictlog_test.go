package bootpolicy_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
)

func verdictNo(i int) *bootpolicy.Verdict {
	v := &bootpolicy.Verdict{Time: time.Unix(int64(i), 0).UTC(), NodeID: fmt.Sprintf("node-%04d", i), Class: "worker", Stage: bootpolicy.BootCheck, Result: "pass",
		Rules: []bootpolicy.RuleResult{{Rule: "secure_boot", Pass: true, Detail: strings.Repeat("x", 900)}}}
	return v
}

// readVerdicts reads every line of a verdict log file as a verdict.
func readVerdicts(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ids []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var v bootpolicy.Verdict
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s: a line that is not a verdict: %v", path, err)
		}
		ids = append(ids, v.NodeID)
	}
	return ids
}

func TestVerdictLogRotates(t *testing.T) {
	dir := t.TempDir()
	l, err := bootpolicy.OpenVerdictLog(bootpolicy.VerdictLogConfig{Dir: dir, MaxBytes: bootpolicy.MinVerdictLogMaxBytes, Keep: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// About 1 KiB a line: 64 lines fill a file; 300 lines rotate four
	// times, and only the newest two rotated files stay.
	for i := range 300 {
		if err := l.Append(verdictNo(i)); err != nil {
			t.Fatal(err)
		}
	}
	base := filepath.Join(dir, bootpolicy.VerdictLogName)
	if l.Path() != base {
		t.Fatalf("path %s", l.Path())
	}
	if _, err := os.Stat(base + ".3"); !os.IsNotExist(err) {
		t.Fatalf("a third rotated file: %v", err)
	}
	var all []string
	for _, p := range []string{base + ".2", base + ".1", base} {
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > bootpolicy.MinVerdictLogMaxBytes {
			t.Errorf("%s: %d bytes, more than the maximum", p, st.Size())
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v", p, st.Mode().Perm())
		}
		all = append(all, readVerdicts(t, p)...)
	}
	// The files hold the newest verdicts, in order, up to the last.
	if len(all) == 0 || all[len(all)-1] != "node-0299" {
		t.Fatalf("last verdict %v", all[len(all)-1:])
	}
	for i := 1; i < len(all); i++ {
		if all[i] <= all[i-1] {
			t.Fatalf("verdict %s after %s", all[i], all[i-1])
		}
	}
	if len(all) < 2*60 || len(all) >= 300 {
		t.Fatalf("%d verdicts kept in three files", len(all))
	}
}

// TestVerdictLogCrash reopens a log whose last line a crash cut short:
// the partial line goes, every acknowledged verdict stays, and appending
// goes on after them.
func TestVerdictLogCrash(t *testing.T) {
	dir := t.TempDir()
	l, err := bootpolicy.OpenVerdictLog(bootpolicy.VerdictLogConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if err := l.Append(verdictNo(i)); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	f, err := os.OpenFile(l.Path(), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(`{"time":"2026-01-01T00:00:00Z","node_id":"node-9`); err != nil {
		t.Fatal(err)
	}
	f.Close()

	l, err = bootpolicy.OpenVerdictLog(bootpolicy.VerdictLogConfig{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Append(verdictNo(3)); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(readVerdicts(t, l.Path()), ","); got != "node-0000,node-0001,node-0002,node-0003" {
		t.Fatalf("verdicts after the crash: %s", got)
	}
}

func TestVerdictLogConcurrent(t *testing.T) {
	dir := t.TempDir()
	l, err := bootpolicy.OpenVerdictLog(bootpolicy.VerdictLogConfig{Dir: dir, MaxBytes: bootpolicy.MinVerdictLogMaxBytes, Keep: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 50 {
				if err := l.Append(verdictNo(g*1000 + i)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	n := len(readVerdicts(t, l.Path()))
	for i := 1; ; i++ {
		p := fmt.Sprintf("%s.%d", l.Path(), i)
		if _, err := os.Stat(p); err != nil {
			break
		}
		n += len(readVerdicts(t, p))
	}
	if n != 200 {
		t.Fatalf("%d verdicts written, want 200", n)
	}
}

func TestVerdictLogSettings(t *testing.T) {
	for _, c := range []bootpolicy.VerdictLogConfig{
		{Dir: t.TempDir(), MaxBytes: 1024},
		{Dir: t.TempDir(), Keep: -1},
		{Dir: t.TempDir(), Keep: 101},
		{Dir: filepath.Join(t.TempDir(), "missing")},
	} {
		if l, err := bootpolicy.OpenVerdictLog(c); err == nil {
			l.Close()
			t.Errorf("%+v: opened", c)
		}
	}
}
