package bootpolicy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// ClassStatus counts the nodes of a class by the state their latest
// verdict matched.
type ClassStatus struct {
	Class string `json:"class"`
	Nodes int    `json:"nodes"`
	// Current, Next and Both count passing latest verdicts by
	// [Verdict.Matched]; Failing the failing ones.
	Current int `json:"current"`
	Next    int `json:"next"`
	Both    int `json:"both"`
	Failing int `json:"failing"`
	// Latest is the time of the newest verdict counted.
	Latest time.Time `json:"latest"`
}

// CountStatus takes each node's latest verdict (by Time; verdicts without
// a node, offline checks, are left out) and counts them per class,
// sorted by class: how far a rollout has gone (nodes on next or both),
// and whether promoting would strand nodes (nodes on current alone).
func CountStatus(verdicts []Verdict) []ClassStatus {
	latest := map[string]*Verdict{}
	for i := range verdicts {
		v := &verdicts[i]
		if v.NodeID == "" {
			continue
		}
		if l, ok := latest[v.NodeID]; !ok || v.Time.After(l.Time) {
			latest[v.NodeID] = v
		}
	}
	by := map[string]*ClassStatus{}
	for _, v := range latest {
		c := by[v.Class]
		if c == nil {
			c = &ClassStatus{Class: v.Class}
			by[v.Class] = c
		}
		c.Nodes++
		if v.Time.After(c.Latest) {
			c.Latest = v.Time
		}
		switch {
		case !v.Pass():
			c.Failing++
		case v.Matched == MatchedNext:
			c.Next++
		case v.Matched == MatchedBoth:
			c.Both++
		default:
			c.Current++
		}
	}
	out := make([]ClassStatus, 0, len(by))
	for _, c := range by {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b ClassStatus) int {
		switch {
		case a.Class < b.Class:
			return -1
		case a.Class > b.Class:
			return 1
		}
		return 0
	})
	return out
}

// maxVerdictLine bounds one line of a verdict log read back.
const maxVerdictLine = 1 << 20

// ReadVerdictLogs reads the verdict log in dir (verdicts.jsonl) and its
// rotated files (verdicts.jsonl.1 …, up to [MaxVerdictLogKeep]), oldest
// first. Lines that do not parse (a line a crash cut short) are skipped
// and counted in bad.
func ReadVerdictLogs(dir string) (verdicts []Verdict, bad int, err error) {
	files := []string{}
	for i := MaxVerdictLogKeep; i >= 1; i-- {
		files = append(files, filepath.Join(dir, VerdictLogName+"."+strconv.Itoa(i)))
	}
	files = append(files, filepath.Join(dir, VerdictLogName))
	found := 0
	for _, name := range files {
		f, err := os.Open(name)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, bad, err
		}
		found++
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 0, 64<<10), maxVerdictLine)
		for sc.Scan() {
			var v Verdict
			if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
				bad++
				continue
			}
			verdicts = append(verdicts, v)
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, bad, fmt.Errorf("read %s: %w", name, err)
		}
	}
	if found == 0 {
		return nil, 0, fmt.Errorf("no %s in %s: no verdict recorded there yet", VerdictLogName, dir)
	}
	return verdicts, bad, nil
}
