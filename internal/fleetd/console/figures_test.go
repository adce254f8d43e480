package console

import (
	"strings"
	"testing"
	"time"
)

func TestParseMetrics(t *testing.T) {
	text := `# HELP nodetrust_join_refusals_total Refused joins.
# TYPE nodetrust_join_refusals_total counter
nodetrust_join_refusals_total{reason="token_used"} 3
nodetrust_join_refusals_total{reason="odd \"quoted\" \\ one"} 1
nodetrust_live_sessions 2
nodetrust_renewals_total{code="OK"} 7 1700000000000
`
	ss, err := parseMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 4 {
		t.Fatalf("%d series, want 4: %+v", len(ss), ss)
	}
	if ss[1].labels["reason"] != `odd "quoted" \ one` || ss[1].value != 1 {
		t.Errorf("escaped label: %+v", ss[1])
	}
	s := sampleOf(time.Unix(0, 0), ss)
	if s.sessions != 2 || s.renewals != 7 || s.refusals["join: token_used"] != 3 {
		t.Errorf("sample %+v", s)
	}
}

func TestParseMetricsRefusesMalformedLines(t *testing.T) {
	for _, line := range []string{"nodetrust_x", `nodetrust_x{reason="a} 1`, "nodetrust_x one", `nodetrust_x{reason=a} 1`, "nodetrust_x 1 2 3"} {
		t.Run(line, func(t *testing.T) {
			if _, err := parseMetrics(strings.NewReader(line + "\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
				t.Errorf("parse = %v, want an error naming line 1", err)
			}
		})
	}
}

func TestRateChartCountsPerMinute(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	var ss []sample
	for i, v := range []float64{10, 12, 16, 3} { // the last: the server restarted
		ss = append(ss, sample{at: t0.Add(time.Duration(i) * 30 * time.Second), joins: v})
	}
	ch := rateChart("Joins per minute", ss, func(s sample) float64 { return s.joins })
	if ch.Empty || ch.Max != "8.0" {
		t.Errorf("chart max %q, want 8.0 (4 joins in 30 s)", ch.Max)
	}
	if !strings.Contains(ch.Summary, "6.0 in the latest interval") {
		t.Errorf("summary %q, want the restart's 3 joins in 30 s as 6.0", ch.Summary)
	}
	if n := len(strings.Fields(ch.Points)); n != 3 {
		t.Errorf("%d points, want 3", n)
	}
	if e := rateChart("Joins per minute", nil, func(s sample) float64 { return s.joins }); !e.Empty || !strings.Contains(e.Summary, "no figures") {
		t.Errorf("an empty chart: %+v", e)
	}
}

func FuzzParseMetrics(f *testing.F) {
	f.Add("nodetrust_live_sessions 2\n")
	f.Add(`x{a="b",c="d\"e"} 1 2` + "\n")
	f.Add("# comment\n\n")
	f.Fuzz(func(t *testing.T, text string) {
		_, _ = parseMetrics(strings.NewReader(text))
	})
}
