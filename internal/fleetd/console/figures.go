package console

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MetricsSource reads the control plane's metrics in the Prometheus text
// format.
type MetricsSource interface {
	ReadMetrics(ctx context.Context) (io.ReadCloser, error)
}

// HTTPSMetrics reads GET /metrics from fleetd's HTTPS listener (the one
// that also serves the well-known document).
type HTTPSMetrics struct {
	URL    string
	Client *http.Client
}

// NewHTTPSMetrics reads https://addr/metrics with the TLS config tc (the
// serving CA's pin).
func NewHTTPSMetrics(addr string, tc *tls.Config) *HTTPSMetrics {
	return &HTTPSMetrics{URL: "https://" + addr + "/metrics", Client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}}
}

// ReadMetrics implements MetricsSource.
func (m *HTTPSMetrics) ReadMetrics(ctx context.Context) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.URL, nil)
	if err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	resp, err := m.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read metrics at %s: %w", m.URL, err)
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("read metrics at %s: %s", m.URL, resp.Status)
	}
	return resp.Body, nil
}

// sample is the figures read at one time.
type sample struct {
	at       time.Time
	sessions float64
	joins    float64
	renewals float64
	// refusals are counters by reason ("join: token_used", "renewal:
	// PermissionDenied", …).
	refusals map[string]float64
}

// Bounds of what the figures keep.
const (
	keepSamples = 361
	maxReasons  = 64
)

// figures keeps the last samples.
type figures struct {
	mu      sync.Mutex
	now     func() time.Time
	samples []sample
	lastErr string
	errAt   time.Time
}

func newFigures(now func() time.Time) *figures { return &figures{now: now} }

func (c *Console) scrape(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rc, err := c.cfg.Metrics.ReadMetrics(ctx)
	if err == nil {
		var ss []series
		ss, err = parseMetrics(rc)
		rc.Close()
		if err == nil {
			c.figures.add(sampleOf(c.cfg.Now(), ss))
			return
		}
	}
	c.figures.fail(err)
	c.log.DebugContext(ctx, "console could not read the metrics", "error", err)
}

// sampleOf picks the console's figures out of the metrics.
func sampleOf(at time.Time, ss []series) sample {
	s := sample{at: at, refusals: map[string]float64{}}
	add := func(reason string, v float64) {
		if _, ok := s.refusals[reason]; ok || len(s.refusals) < maxReasons {
			s.refusals[reason] += v
		}
	}
	for _, x := range ss {
		switch x.name {
		case "nodetrust_live_sessions":
			s.sessions += x.value
		case "nodetrust_join_requests_total":
			if x.labels["outcome"] == "signed" {
				s.joins += x.value
			}
		case "nodetrust_renewals_total":
			if x.labels["code"] == "OK" {
				s.renewals += x.value
			} else {
				add("renewal: "+x.labels["code"], x.value)
			}
		case "nodetrust_join_refusals_total":
			add("join: "+x.labels["reason"], x.value)
		case "nodetrust_admin_calls_total":
			if x.labels["outcome"] == "refused" {
				add("admin: role may not", x.value)
			}
		case "nodetrust_connections_refused_total":
			add("connection: "+x.labels["listener"]+" "+x.labels["limit"], x.value)
		}
	}
	return s
}

func (f *figures) add(s sample) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.samples = append(f.samples, s)
	if len(f.samples) > keepSamples {
		f.samples = slices.Delete(f.samples, 0, len(f.samples)-keepSamples)
	}
	f.lastErr = ""
}

func (f *figures) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lastErr = err.Error()
	f.errAt = f.now()
}

func (f *figures) snapshot() ([]sample, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.samples), f.lastErr
}

// Chart geometry, in SVG user units.
const (
	chartW = 300
	chartH = 80
	// chartTop leaves room for the "max" label; chartBottom keeps a zero
	// line off the frame.
	chartTop    = 16
	chartBottom = 3
)

// chart is one small line chart, drawn by the server as inline SVG.
type chart struct {
	Title   string
	Summary string
	Max     string
	Points  string
	Width   int
	Height  int
	Empty   bool
}

// reasonBar is one refusal reason: its counter and its share of the
// largest, for a bar.
type reasonBar struct {
	Reason    string
	Total     string
	LastHour  string
	Width     int
	Y, TextY  int
	BarHeight int
}

type figuresView struct {
	From        string
	Error       string
	Samples     int
	Span        string
	Charts      []chart
	Reasons     []reasonBar
	ReasonsH    int
	Console     []reasonBar
	NotMeasured bool
}

func (c *Console) figuresPage(w http.ResponseWriter, r *http.Request, s *session) {
	v := figuresView{From: c.cfg.MetricsFrom}
	if c.cfg.Metrics == nil {
		v.NotMeasured = true
		c.render(w, http.StatusOK, s, "figures", "Live figures", "figures", v)
		return
	}
	samples, errText := c.figures.snapshot()
	v.Error, v.Samples = errText, len(samples)
	if len(samples) > 1 {
		v.Span = samples[len(samples)-1].at.Sub(samples[0].at).Round(time.Second).String()
	}
	v.Charts = []chart{
		gaugeChart("Live sessions", samples, func(s sample) float64 { return s.sessions }),
		rateChart("Joins per minute", samples, func(s sample) float64 { return s.joins }),
		rateChart("Renewals per minute", samples, func(s sample) float64 { return s.renewals }),
		rateChart("Refusals per minute", samples, func(s sample) float64 {
			t := 0.0
			for _, v := range s.refusals {
				t += v
			}
			return t
		}),
	}
	v.Reasons = reasonBars(samples)
	v.ReasonsH = len(v.Reasons) * 22
	c.render(w, http.StatusOK, s, "figures", "Live figures", "figures", v)
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func rate1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

// gaugeChart draws a gauge's samples.
func gaugeChart(title string, ss []sample, val func(sample) float64) chart {
	vals := make([]float64, len(ss))
	for i, s := range ss {
		vals[i] = val(s)
	}
	ch := draw(title, vals)
	if len(vals) > 0 {
		ch.Summary = fmt.Sprintf("%s: %s now, at most %s over %d samples.", title, num(vals[len(vals)-1]), ch.Max, len(vals))
	}
	return ch
}

// rateChart draws a counter's increase per minute between samples (a
// counter that went down, a restarted server, counts from zero).
func rateChart(title string, ss []sample, val func(sample) float64) chart {
	var rates []float64
	for i := 1; i < len(ss); i++ {
		dt := ss[i].at.Sub(ss[i-1].at).Minutes()
		if dt <= 0 {
			continue
		}
		d := val(ss[i]) - val(ss[i-1])
		if d < 0 {
			d = val(ss[i])
		}
		rates = append(rates, d/dt)
	}
	ch := draw(title, rates)
	if len(rates) > 0 {
		ch.Summary = fmt.Sprintf("%s: %s in the latest interval, at most %s, over %d intervals.", title, rate1(rates[len(rates)-1]), ch.Max, len(rates))
	}
	return ch
}

// draw scales vals into a polyline.
func draw(title string, vals []float64) chart {
	ch := chart{Title: title, Width: chartW, Height: chartH, Empty: len(vals) == 0, Max: "0"}
	if ch.Empty {
		ch.Summary = title + ": no figures read yet."
		return ch
	}
	max := 0.0
	for _, v := range vals {
		max = maxf(max, v)
	}
	ch.Max = rate1(max)
	if max == 0 {
		max = 1
	}
	if len(vals) == 1 {
		// One figure: a level line across the chart.
		vals = []float64{vals[0], vals[0]}
	}
	var b strings.Builder
	n := len(vals)
	for i, v := range vals {
		x := float64(i) * float64(chartW) / float64(n-1)
		y := float64(chartH-chartBottom) - v/max*float64(chartH-chartBottom-chartTop)
		fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
	}
	ch.Points = strings.TrimSpace(b.String())
	return ch
}

func maxf(a, b float64) float64 {
	if b > a {
		return b
	}
	return a
}

// reasonBars are the refusal counters by reason, largest first.
func reasonBars(ss []sample) []reasonBar {
	if len(ss) == 0 {
		return nil
	}
	first, last := ss[0], ss[len(ss)-1]
	var out []reasonBar
	max := 0.0
	for reason, v := range last.refusals {
		if v == 0 {
			continue
		}
		max = maxf(max, v)
		hour := v - first.refusals[reason]
		if hour < 0 {
			hour = v
		}
		out = append(out, reasonBar{Reason: reason, Total: num(v), LastHour: num(hour), Width: int(v)})
	}
	slices.SortFunc(out, func(a, b reasonBar) int {
		if a.Width != b.Width {
			return b.Width - a.Width
		}
		return strings.Compare(a.Reason, b.Reason)
	})
	for i := range out {
		v, _ := strconv.ParseFloat(out[i].Total, 64)
		out[i].Width = max1(int(v / max * 200))
		out[i].Y = i * 22
		out[i].TextY = i*22 + 15
		out[i].BarHeight = 18
	}
	return out
}

func max1(n int) int {
	if n < 1 {
		return 1
	}
	return n
}
