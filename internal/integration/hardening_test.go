package integration

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/joinv1"
)

// The end-to-end tests of fleetd under hostile traffic (docs/security.md,
// "Hostile traffic"): the real fleetd and bcd binaries on loopback, the
// attacker in this process. Loopback is all of 127.0.0.0/8 on Linux, so
// the attacker's connections come from their own source addresses.

const floodLimits = `http_listen = "127.0.0.1:0"
[limits]
max_connections = 1200
max_connections_per_source = 400
max_handshakes = 600
http_max_connections = 64
handshake_timeout = "4s"
idle_timeout = "3s"
`

// Under floodLimits fleetd holds at most 1,200 gRPC and 64 HTTPS
// connections; the rest of its descriptors are the store, its log and
// the listeners.
const (
	floodMaxFDs = 1200 + 64 + 64
	// floodMaxRSSKiB bounds fleetd's peak resident memory during the
	// flood: its base (about 30 MiB) and 1,264 connections at well under
	// the 56 KiB an idle TLS connection was measured to cost (about 40 MiB
	// was measured here).
	floodMaxRSSKiB = 128 << 10
)

func TestConnectionFloodEndToEnd(t *testing.T) {
	cp := startControlPlane(t, floodLimits)
	pid := cp.cmd.Process.Pid

	// A node with a live session, which the flood must not cut.
	a := newMachine(t, cp, "", "")
	nodeA := a.join(t, cp)
	agent := startAgent(t, a)
	agent.waitFor(t, sessionOpenRE, 30*time.Second)

	// 20,000 connections attempted from four sources, at most 4,000 held
	// on this side at once (the open-file limit here is 20,000). Every
	// 50th finishes a TLS handshake and then sends nothing.
	const sources, perSource, heldPerSource = 4, 5000, 1000
	var attempted, dialFailed atomic.Int64
	started := make(chan struct{})
	var startOnce sync.Once
	var wg sync.WaitGroup
	for s := range sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			src := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(2+s))}
			d := net.Dialer{LocalAddr: src, Timeout: 5 * time.Second}
			var held []net.Conn
			defer func() {
				for _, c := range held {
					c.Close()
				}
			}()
			for i := range perSource {
				if i == perSource/4 {
					startOnce.Do(func() { close(started) })
				}
				attempted.Add(1)
				c, err := d.Dial("tcp", cp.addr)
				if err != nil {
					dialFailed.Add(1)
					continue
				}
				if i%50 == 0 {
					tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) // #nosec: the attacker checks nothing
					_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
					if tc.Handshake() == nil {
						_ = tc.SetDeadline(time.Time{})
						c = tc
					}
				}
				held = append(held, c)
				if len(held) > heldPerSource {
					held[0].Close()
					held = held[1:]
				}
			}
		}()
	}

	var peak procUsage
	sampleDone := make(chan struct{})
	stopSampling := make(chan struct{})
	go func() {
		defer close(sampleDone)
		for {
			if u, err := usageOf(pid); err == nil {
				peak.fds = max(peak.fds, u.fds)
				peak.peakRSSKiB = max(peak.peakRSSKiB, u.peakRSSKiB)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	// A legitimate join from 127.0.0.1 while the flood runs.
	<-started
	b := newMachine(t, cp, "", "")
	nodeB := b.join(t, cp)
	joinedDuring := attempted.Load() < sources*perSource
	wg.Wait()
	close(stopSampling)
	<-sampleDone

	t.Logf("attempted %d connections (%d dials failed); fleetd peaked at %d descriptors and %d KiB resident",
		attempted.Load(), dialFailed.Load(), peak.fds, peak.peakRSSKiB)
	if !joinedDuring {
		t.Errorf("node %s joined only after the flood ended", nodeB)
	}
	if peak.fds > floodMaxFDs {
		t.Errorf("fleetd held %d descriptors, over the configured limits' %d", peak.fds, floodMaxFDs)
	}
	if peak.peakRSSKiB > floodMaxRSSKiB {
		t.Errorf("fleetd peaked at %d KiB resident, over %d KiB", peak.peakRSSKiB, floodMaxRSSKiB)
	}
	refused := cp.metric(t, `nodetrust_connections_refused_total{limit="per_source",listener="grpc"}`) +
		cp.metric(t, `nodetrust_connections_refused_total{limit="total",listener="grpc"}`) +
		cp.metric(t, `nodetrust_connections_refused_total{limit="handshakes",listener="grpc"}`)
	if refused < 1000 {
		t.Errorf("%v connections refused over the limits, want most of the 20,000", refused)
	}

	t.Run("a connection that never handshakes is closed", func(t *testing.T) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 9)}}
		c, err := d.Dial("tcp", cp.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if !closedWithin(c, 30*time.Second) {
			t.Fatal("a silent connection was still open 30s after the 4s handshake timeout")
		}
	})
	t.Run("a connection that carries no stream is closed", func(t *testing.T) {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 10)}}
		c, err := tls.DialWithDialer(d, "tcp", cp.addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) // #nosec: the attacker checks nothing
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// The HTTP/2 preface and an empty SETTINGS frame: a client that
		// connected and calls nothing.
		if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
			t.Fatal(err)
		}
		if !closedWithin(c, 30*time.Second) {
			t.Fatal("an HTTP/2 connection without a stream was still open 30s after the 3s idle timeout")
		}
	})

	// The live session outlived the flood and the idle timeout: fleetd
	// opened it once, and the node never reconnected.
	if n := strings.Count(cp.log.String(), `msg="session opened" node_id=`+nodeA+" "); n != 1 {
		t.Errorf("fleetd opened %d sessions for node %s, want the one, never cut:\n%s", n, nodeA, tail(cp.log.String(), 40))
	}
	if n := len(sessionOpenRE.FindAllString(agent.log.String(), -1)); n != 1 {
		t.Errorf("bcd node opened its session %d times, want once:\n%s", n, agent.log)
	}
	if v := cp.metric(t, "nodetrust_live_sessions"); v != 1 {
		t.Errorf("live sessions %v after the flood, want 1", v)
	}
}

// closedWithin reports whether the server closes c within limit: reads
// end in EOF or a reset (whatever the server sent before, such as a
// GOAWAY, is discarded).
func closedWithin(c net.Conn, limit time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(limit))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// hammer calls call from workers goroutines for d, and returns how many
// calls were made. Every answer must be PERMISSION_DENIED "Join refused".
func hammer(t *testing.T, workers int, d time.Duration, call func() error) int64 {
	t.Helper()
	var n, wrong atomic.Int64
	var firstWrong atomic.Value
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				err := call()
				n.Add(1)
				if st, _ := status.FromError(err); st.Code() != codes.PermissionDenied || st.Message() != "Join refused" {
					wrong.Add(1)
					firstWrong.CompareAndSwap(nil, err)
				}
			}
		}()
	}
	wg.Wait()
	if wrong.Load() > 0 {
		t.Errorf("%d of %d calls were not answered \"Join refused\"; the first: %v", wrong.Load(), n.Load(), firstWrong.Load())
	}
	return n.Load()
}

func TestSpentTokenReplayEndToEnd(t *testing.T) {
	cp := startControlPlane(t, `http_listen = "127.0.0.1:0"`)
	secret := cp.token(t, "--role", "worker")
	r := run(t, secret+"\n", claimsEnv(t), "bcd", cp.joinArgs(t.TempDir()+"/bcd")...)
	if r.code != 0 {
		t.Fatalf("bcd join: %s", r)
	}
	before := cp.auditCount(t, "join.refused")

	// 32 workers replay the spent token for 10 seconds, each request
	// with a fresh key and CSR, the token sealed to it.
	client := cp.joinClient(t)
	const workers = 32
	reqs := make(chan *joinv1.JoinRequest, 256)
	stop := make(chan struct{})
	go func() {
		defer close(reqs)
		for {
			select {
			case reqs <- cp.sealedJoin(t, secret):
			case <-stop:
				return
			}
		}
	}()
	calls := hammer(t, workers, 10*time.Second, func() error {
		_, err := client.Join(context.Background(), <-reqs)
		return err
	})
	close(stop)

	after := cp.auditCount(t, "join.refused")
	t.Logf("%d replays in 10s; refusal audit records %d → %d", calls, before, after)
	if calls < 200 {
		t.Fatalf("only %d replays in 10s: the test did not load the server", calls)
	}
	// One token, one reason (token_used), one window of 10 minutes.
	if after-before > 1 {
		t.Errorf("the audit grew by %d records under %d replays, want at most 1", after-before, calls)
	}
	if after-before < 1 {
		t.Errorf("the replay of a spent token was not audited at all")
	}
	cp.waitMetric(t, `nodetrust_join_refusals_total{reason="token_used"}`, float64(calls))
	cp.waitMetric(t, "nodetrust_refusal_audits_dropped_total", float64(calls-1))
}

func TestRefusalLogFloodEndToEnd(t *testing.T) {
	cp := startControlPlane(t, "http_listen = \"127.0.0.1:0\"\n[limits]\nrefusal_log_burst = 5\nrefusal_log_window = \"2s\"\n")
	client := cp.joinClient(t)
	garbage := &joinv1.JoinRequest{Attestor: "token", Csr: []byte("not a CSR"), Claims: &joinv1.HardwareClaims{Hostname: "flood"}}
	before := cp.logLines()
	calls := hammer(t, 32, 10*time.Second, func() error {
		_, err := client.Join(context.Background(), garbage)
		return err
	})
	// The summary of the last window comes at its end.
	summaryRE := regexp.MustCompile(`msg="refusal log lines dropped" dropped=(\d+)`)
	deadline := time.Now().Add(10 * time.Second)
	var dropped int
	for {
		dropped = 0
		for _, m := range summaryRE.FindAllStringSubmatch(cp.log.String(), -1) {
			n, _ := strconv.Atoi(m[1])
			dropped += n
		}
		if int64(dropped)+int64(strings.Count(cp.log.String(), `msg="join refused"`)) >= calls || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	grown := cp.logLines() - before
	// One source, one reason: 5 lines per 2s window over 10s (6 windows
	// at most, with the partial ones), one summary per window, and a few
	// lines of other business.
	const bound = 5*7 + 7 + 10
	t.Logf("%d refused joins in 10s; the log grew by %d lines; %d lines reported dropped", calls, grown, dropped)
	if calls < 1000 {
		t.Fatalf("only %d joins in 10s: the test did not load the server", calls)
	}
	if grown > bound {
		t.Errorf("the log grew by %d lines under %d refused joins, want at most %d:\n%s", grown, calls, bound, tail(cp.log.String(), 30))
	}
	if refusedLines := strings.Count(cp.log.String(), `msg="join refused"`); int64(dropped+refusedLines) != calls {
		t.Errorf("%d refusal lines logged and %d dropped, want the %d refusals accounted for", refusedLines, dropped, calls)
	}
	cp.waitMetric(t, `nodetrust_join_refusals_total{reason="csr_invalid"}`, float64(calls))
}

func TestOversizedRequestsEndToEnd(t *testing.T) {
	cp := startControlPlane(t, `http_listen = "127.0.0.1:0"`)
	client := cp.joinClient(t)
	ctx := context.Background()
	big := func(n int) *joinv1.HardwareClaims { return &joinv1.HardwareClaims{Hostname: strings.Repeat("x", n)} }

	// A join over its limit is refused like any join.
	_, err := client.Join(ctx, &joinv1.JoinRequest{Attestor: "token", Csr: []byte{1}, Claims: big(100 << 10)})
	if st, _ := status.FromError(err); st.Code() != codes.PermissionDenied || st.Message() != "Join refused" {
		t.Fatalf("a 100 KiB token join answered %v, want PERMISSION_DENIED \"Join refused\"", err)
	}
	// One over what gRPC reads at all is refused unread, and counted.
	_, err = client.Join(ctx, &joinv1.JoinRequest{Attestor: "tpm", Claims: big(2 << 20)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 2 MiB join answered %v, want RESOURCE_EXHAUSTED", err)
	}
	// Other methods have their own limits.
	_, err = client.Renew(ctx, &joinv1.RenewRequest{Csr: make([]byte, 100<<10)})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "limit of /nodetrust.join.v1.JoinService/Renew") {
		t.Fatalf("a 100 KiB renewal answered %v, want RESOURCE_EXHAUSTED naming its limit", err)
	}

	cp.waitMetric(t, `nodetrust_join_refusals_total{reason="oversized"}`, 2)
	cp.waitMetric(t, `nodetrust_oversized_requests_total{method="/nodetrust.join.v1.JoinService/Join"}`, 1)
	cp.waitMetric(t, `nodetrust_oversized_requests_total{method="/nodetrust.join.v1.JoinService/Renew"}`, 1)
	log := cp.log.String()
	if !strings.Contains(log, `msg="join refused"`) || !strings.Contains(log, "reason_code=oversized") {
		t.Errorf("the oversized join's refusal is not logged:\n%s", tail(log, 20))
	}
	if n := strings.Count(log, `msg="request over its size limit"`); n < 2 {
		t.Errorf("%d log lines of requests over their limit, want the 2 MiB join and the renewal:\n%s", n, tail(log, 20))
	}
}
