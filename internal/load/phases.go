package load

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/internal/cputime"
)

// runner holds what the phases share.
type runner struct {
	c     *Config
	cp    *controlPlane
	t     *target
	nodes []*simNode
}

// phase collects one phase's measurements while it runs.
type phase struct {
	ctr *counter

	mu      sync.Mutex
	lat     []time.Duration
	errors  int
	samples map[string]int
}

func newPhase(name string, total int) *phase {
	return &phase{ctr: &counter{name: name, total: total}, samples: map[string]int{}}
}

func (p *phase) ok(d time.Duration) {
	p.ctr.ok.Add(1)
	p.mu.Lock()
	p.lat = append(p.lat, d)
	p.mu.Unlock()
}

// failed counts a failed attempt and keeps a few distinct messages.
func (p *phase) failed(err error) {
	p.ctr.fail.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errors++
	msg := err.Error()
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	if _, ok := p.samples[msg]; ok || len(p.samples) < 8 {
		p.samples[msg]++
	}
}

// maxPushback is the longest server pushback the tool waits out.
const maxPushback = 10 * time.Second

// retryable reports whether a failure may go away by itself, and after
// how long.
func retryable(err error, try int) (time.Duration, bool) {
	var oe *opError
	if !errors.As(err, &oe) {
		return 0, false
	}
	switch oe.code {
	case codes.Unavailable, codes.ResourceExhausted, codes.Aborted:
	default:
		return 0, false
	}
	if oe.pushback > 0 {
		return oe.pushback, oe.pushback <= maxPushback
	}
	// Full jitter in [b/2, b], b = 100 ms doubling.
	b := 100 * time.Millisecond << min(try, 6)
	return b/2 + rand.N(b/2+1), true
}

// attempt runs f, retrying retryable failures up to c.Retries times. It
// records each failed attempt in p and, on success, the latency from the
// first attempt's start, retries and their waits included.
func (r *runner) attempt(ctx context.Context, p *phase, f func() error) error {
	start := time.Now()
	for try := 0; ; try++ {
		err := f()
		if err == nil {
			p.ok(time.Since(start))
			return nil
		}
		p.failed(err)
		wait, ok := retryable(err, try)
		if !ok || try >= r.c.Retries || ctx.Err() != nil {
			return err
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// pool runs f(i) for i in [0, n) on at most c.Concurrency workers.
func (r *runner) pool(ctx context.Context, n, workers int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(workers, n) {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				f(i)
			}
		})
	}
	wg.Wait()
}

// parallel runs f(i) for i in [0, n) on every core: untimed preparation
// and checks.
func (r *runner) parallel(ctx context.Context, n int, f func(i int)) {
	r.pool(ctx, n, runtime.GOMAXPROCS(0), f)
}

// measure runs body as the phase p and returns its result: the server's
// CPU time and peak memory over it, this process's CPU time, and p's
// counts and latencies.
func (r *runner) measure(p *phase, body func()) PhaseResult {
	pids := r.cp.pids
	var before procUsage
	peakReset := false
	heapBefore, heapErr := r.cp.heap(true)
	if len(pids) > 0 {
		peakReset = resetPeaks(pids) == nil
		before, _ = sampleProcs(pids)
	}
	tool0 := cputime.Process()
	stop := make(chan struct{})
	watched := make(chan struct{})
	p.ctr.start = time.Now()
	go func() { r.c.con.watch(p.ctr, pids, stop); close(watched) }()
	body()
	elapsed := time.Since(p.ctr.start)
	close(stop)
	<-watched
	res := p.result(elapsed)
	res.ToolCPUSeconds = (cputime.Process() - tool0).Seconds()
	if len(pids) > 0 {
		if after, err := sampleProcs(pids); err == nil {
			res.Server = &ServerUsage{
				CPUSeconds:     (after.CPU - before.CPU).Seconds(),
				PeakRSSBytes:   after.HWM,
				PeakSincePhase: peakReset,
				RSSBeforeBytes: before.RSS,
				RSSAfterBytes:  after.RSS,
			}
			res.Server.perOp(res.Ops)
			if heapErr == nil {
				if h, err := r.cp.heap(true); err == nil {
					res.Server.HeapBeforeBytes = int64(heapBefore.HeapObjectsBytes + heapBefore.StacksBytes)
					res.Server.HeapAfterBytes = int64(h.HeapObjectsBytes + h.StacksBytes)
				}
			}
		} else if !r.cp.alive() {
			r.c.warnf("the server is gone: %v", err)
		}
	}
	return res
}

// result turns the phase's counts into a PhaseResult.
func (p *phase) result(elapsed time.Duration) PhaseResult {
	p.mu.Lock()
	defer p.mu.Unlock()
	res := PhaseResult{Name: p.ctr.name, Planned: p.ctr.total, Ops: len(p.lat), Errors: p.errors, Seconds: elapsed.Seconds()}
	if elapsed > 0 {
		res.OpsPerSecond = float64(res.Ops) / elapsed.Seconds()
	}
	lat := slices.Clone(p.lat)
	slices.Sort(lat)
	res.P50Ms, res.P90Ms, res.P99Ms = ms(percentile(lat, 0.50)), ms(percentile(lat, 0.90)), ms(percentile(lat, 0.99))
	if len(lat) > 0 {
		res.MaxMs = ms(lat[len(lat)-1])
	}
	for msg, n := range p.samples {
		res.ErrorSamples = append(res.ErrorSamples, fmt.Sprintf("%d× %s", n, msg))
	}
	slices.Sort(res.ErrorSamples)
	return res
}

// percentile is the nearest-rank percentile q of sorted values.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*q+0.999999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
