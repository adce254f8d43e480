package load

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/pki"
)

// Phase names, as in the table and the JSON.
const (
	phaseTokens  = "tokens"
	phaseJoin    = "join"
	phaseSession = "session"
	phaseRenew   = "renew"
	phaseRevoke  = "revoke"
)

// Run makes one run: it starts or targets the control plane, measures the
// crypto floor, runs the phases, checks what must hold, prints the report
// to c.Out and writes it to c.JSON. A failed check is in the report (OK
// false), not an error; an error means the run could not be made.
func Run(ctx context.Context, c Config) (*Report, error) {
	c.defaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	rep := &Report{Started: time.Now().UTC(), Machine: describeMachine()}
	// Each held session is one descriptor in each process.
	lim, err := raiseNoFile(uint64(c.Nodes + c.Concurrency + 1024))
	if err != nil {
		return nil, err
	}
	if lim.Cur < uint64(c.Nodes+c.Concurrency+64) {
		c.warnf("RLIMIT_NOFILE is %d, too few for %d sessions; raise the hard limit (ulimit -Hn)", lim.Cur, c.Nodes)
	}

	var cp *controlPlane
	if c.ServerConfig != "" {
		cp, err = targetControlPlane(ctx, &c, c.warnf)
	} else {
		cp, err = startControlPlane(ctx, &c)
	}
	if err != nil {
		return nil, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = cp.stop(&c)
		}
	}()
	kexNames, kexIDs, _ := c.keyExchanges()
	rep.Run = RunInfo{Nodes: c.Nodes, Concurrency: c.Concurrency, Renewals: c.Renewals, Revoke: c.Revoke,
		KEM: cp.jwk.KEM(), KeyExchanges: kexNames, Server: "targeted", Address: cp.addr, NoFile: lim.Cur}
	if len(cp.pids) == 1 {
		rep.Run.PID = cp.pids[0]
	} else if len(cp.pids) > 1 {
		rep.Run.PIDs = cp.pids
	}
	if cp.started {
		rep.Run.Server = "started"
		if locs, err := pki.LocateKeys(filepath.Join(cp.dir, "pki")); err == nil {
			for _, l := range locs {
				if l.Ref != "" {
					rep.Run.TokenKeys = append(rep.Run.TokenKeys, string(l.Use)+" "+l.Ref)
				}
			}
		}
	}

	c.con.status("measuring the crypto floor")
	if rep.Floor, err = measureFloor(ctx, cp.jwk.KEM(), kexIDs, c.FloorTime); err != nil {
		return nil, err
	}
	c.con.done()
	if len(cp.pids) > 0 {
		if u, err := sampleProcs(cp.pids); err == nil {
			rep.Run.ServerRSSIdleBytes = u.RSS
		}
	}

	r := &runner{c: &c, cp: cp, t: &target{addrs: strings.Split(cp.addr, ","), serverName: cp.bundle.ServerName, pins: cp.bundle, transport: c.SessionTransport}}
	runID := make([]byte, 3)
	_, _ = rand.Read(runID)
	for i := range c.Nodes {
		r.nodes = append(r.nodes, newSimNode(hex.EncodeToString(runID), i))
	}
	defer r.closeSessions()

	rep.Phases = append(rep.Phases, r.tokens(ctx))
	c.con.status("preparing keys, CSRs and sealed tokens")
	var prepErrs atomic.Int64
	r.parallel(ctx, len(r.nodes), func(i int) {
		n := r.nodes[i]
		if n.token == "" {
			return
		}
		if err := n.prepare(cp.jwk, c.Role, c.Renewals); err != nil {
			prepErrs.Add(1)
			n.req = nil
		}
	})
	c.con.done()
	if n := prepErrs.Load(); n > 0 {
		return nil, fmt.Errorf("%d nodes could not prepare their join", n)
	}
	rep.Phases = append(rep.Phases, r.joins(ctx))
	joinFailures := r.checkJoins(ctx)
	rep.Phases = append(rep.Phases, r.sessions(ctx, rep.Run.ServerRSSIdleBytes))
	rep.Run.SessionTransport = c.SessionTransport
	rep.Run.SessionsFramed, rep.Run.SessionsGRPC, rep.Run.SessionsFellBack = r.t.framed.Load(), r.t.grpc.Load(), r.t.fellBack.Load()
	if n := rep.Run.SessionsFellBack; n > 0 {
		c.warnf("%d sessions went over gRPC: the server refuses the framed session (a fleetd older than it); to measure gRPC sessions without this note, pass --session-transport grpc", n)
	}
	renewPins, renewFailures := []pki.Pin(nil), []string(nil)
	if c.Renewals > 0 {
		rep.Phases = append(rep.Phases, r.renewals(ctx))
		renewPins, renewFailures = r.checkRenewals(ctx)
	}
	var revoked []*simNode
	if c.Revoke > 0 {
		var res PhaseResult
		res, revoked = r.revocations(ctx)
		rep.Phases = append(rep.Phases, res)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// Watch for sessions that end though nothing revoked them.
	time.Sleep(c.Settle)
	rep.Checks = r.checks(joinFailures, renewPins, renewFailures, revoked)
	if !cp.alive() {
		rep.Checks = append(rep.Checks, Check{Name: "the server ran to the end", Detail: "fleetd exited during the run:\n" + cp.log.String()})
	}

	if u, err := sampleProc(os.Getpid()); err == nil {
		rep.Run.ToolPeakRSSBytes = u.HWM
	}
	r.closeSessions()
	stopped = true
	if err := cp.stop(&c); err != nil {
		rep.Checks = append(rep.Checks, Check{Name: "the server stopped cleanly", Detail: err.Error()})
	}
	rep.OK = true
	for _, ch := range rep.Checks {
		rep.OK = rep.OK && ch.OK
	}
	rep.compare()
	rep.judge()
	rep.print(c.Out)
	if c.JSON != "" {
		if err := rep.writeJSON(c.JSON); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// tokens creates one join token per node through the Admin API.
func (r *runner) tokens(ctx context.Context) PhaseResult {
	p := newPhase(phaseTokens, len(r.nodes))
	return r.measure(p, func() {
		r.pool(ctx, len(r.nodes), r.c.Concurrency, func(i int) {
			n := r.nodes[i]
			_ = r.attempt(ctx, p, func() error {
				cctx, cancel := context.WithTimeout(ctx, r.c.Timeout)
				defer cancel()
				var tr metadata.MD
				resp, err := r.cp.admin.CreateToken(cctx, &adminv1.CreateTokenRequest{Role: r.c.Role, Site: r.c.Site}, grpc.Trailer(&tr))
				if err != nil {
					return rpcError(err, tr)
				}
				n.token = resp.Token
				return nil
			})
		})
	})
}

// joins joins every node that has a prepared request, each on a fresh
// TLS connection.
func (r *runner) joins(ctx context.Context) PhaseResult {
	var ready []*simNode
	for _, n := range r.nodes {
		if n.req != nil {
			ready = append(ready, n)
		}
	}
	p := newPhase(phaseJoin, len(r.nodes))
	return r.measure(p, func() {
		r.pool(ctx, len(ready), r.c.Concurrency, func(i int) {
			n := ready[i]
			_ = r.attempt(ctx, p, func() error { return n.join(ctx, r.t, r.c.Timeout) })
		})
	})
}

// failures collects a few messages of failed checks.
type failures struct {
	mu   sync.Mutex
	n    int
	msgs []string
}

func (f *failures) add(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	if len(f.msgs) < 5 {
		f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
	}
}

func (f *failures) String() string {
	if f.n == 0 {
		return ""
	}
	return fmt.Sprintf("%d failed, e.g. %s", f.n, strings.Join(f.msgs, "; "))
}

// checkJoins checks every join's answer as a node does.
func (r *runner) checkJoins(ctx context.Context) *failures {
	r.c.con.status("checking the joins' answers")
	defer r.c.con.done()
	f := &failures{}
	r.parallel(ctx, len(r.nodes), func(i int) {
		n := r.nodes[i]
		if n.signed == nil {
			f.add("node %d has no answer", n.idx)
			return
		}
		if err := n.checkJoin(r.t.pins, r.c.Role); err != nil {
			f.add("node %d: %v", n.idx, err)
		}
	})
	return f
}

// sessions opens every joined node's live session and holds it; then,
// after Settle, reads the server's memory with all of them held.
func (r *runner) sessions(ctx context.Context, idleRSS int64) PhaseResult {
	var joined []*simNode
	for _, n := range r.nodes {
		if n.joined {
			joined = append(joined, n)
		}
	}
	p := newPhase(phaseSession, len(joined))
	res := r.measure(p, func() {
		r.pool(ctx, len(joined), r.c.Concurrency, func(i int) {
			n := joined[i]
			_ = r.attempt(ctx, p, func() error { return n.openSession(ctx, r.t, r.c.Timeout) })
		})
	})
	if s := res.Server; s != nil && res.Ops > 0 {
		r.c.con.status(fmt.Sprintf("holding %d sessions for %s", res.Ops, r.c.Settle))
		time.Sleep(r.c.Settle)
		r.c.con.done()
		if h, err := r.cp.heap(true); err == nil && s.HeapBeforeBytes > 0 {
			s.HeapHeldBytes = int64(h.HeapObjectsBytes + h.StacksBytes)
			s.HeapPerSessionBytes = float64(s.HeapHeldBytes-s.HeapBeforeBytes) / float64(res.Ops)
			s.GoroutinesHeld = int64(h.Goroutines)
		}
		if u, err := sampleProcs(r.cp.pids); err == nil {
			s.RSSHeldBytes = u.RSS
			s.PeakRSSWithSessionsHeldBytes = u.HWM
			s.RSSPerSessionBytes = float64(u.RSS-s.RSSBeforeBytes) / float64(res.Ops)
			if idleRSS > 0 {
				s.RSSPerSessionSinceIdleBytes = float64(u.RSS-idleRSS) / float64(res.Ops)
			}
		}
	}
	return res
}

// renewals renews every node with a session Renewals times over it,
// round by round.
func (r *runner) renewals(ctx context.Context) PhaseResult {
	var live []*simNode
	for _, n := range r.nodes {
		if n.sess != nil {
			live = append(live, n)
		}
	}
	jobs := len(live) * r.c.Renewals
	p := newPhase(phaseRenew, jobs)
	return r.measure(p, func() {
		r.pool(ctx, jobs, r.c.Concurrency, func(i int) {
			n, round := live[i%len(live)], i/len(live)
			n.mu.Lock()
			defer n.mu.Unlock()
			_ = r.attempt(ctx, p, func() error { return n.renew(round, r.c.Timeout) })
		})
	})
}

// checkRenewals checks every renewal's answer and returns the pins of the
// keys they certified.
func (r *runner) checkRenewals(ctx context.Context) ([]pki.Pin, []string) {
	r.c.con.status("checking the renewals' answers")
	defer r.c.con.done()
	var mu sync.Mutex
	var pins []pki.Pin
	f := &failures{}
	r.parallel(ctx, len(r.nodes), func(i int) {
		n := r.nodes[i]
		got, err := n.checkRenewals(r.t.pins, r.c.Role)
		if err != nil {
			f.add("node %s: %v", n.nodeID, err)
		}
		mu.Lock()
		pins = append(pins, got...)
		mu.Unlock()
	})
	if f.n > 0 {
		return pins, []string{f.String()}
	}
	return pins, nil
}

// revocations revokes Revoke nodes, spread over the held sessions,
// through the Admin API while every session is held, and measures each
// from the call's start to its session's RevocationNotice.
func (r *runner) revocations(ctx context.Context) (PhaseResult, []*simNode) {
	var live []*simNode
	for _, n := range r.nodes {
		if n.sess != nil && !n.sess.isEnded() {
			live = append(live, n)
		}
	}
	m := min(r.c.Revoke, len(live))
	targets := make([]*simNode, 0, m)
	for i := range m {
		targets = append(targets, live[i*len(live)/m])
	}
	p := newPhase(phaseRevoke, m)
	var wg sync.WaitGroup
	res := r.measure(p, func() {
		r.pool(ctx, m, r.c.Concurrency, func(i int) {
			n := targets[i]
			n.revoked = true
			n.revokeStart = time.Now()
			wg.Go(func() {
				t := time.NewTimer(r.c.Timeout)
				defer t.Stop()
				select {
				case <-n.sess.notice:
					p.ok(n.sess.noticeAt.Sub(n.revokeStart))
				case <-t.C:
					p.failed(fmt.Errorf("no RevocationNotice within %s", r.c.Timeout))
				case <-ctx.Done():
				}
			})
			cctx, cancel := context.WithTimeout(ctx, r.c.Timeout)
			defer cancel()
			resp, err := r.cp.admin.RevokeNode(cctx, &adminv1.RevokeNodeRequest{Id: n.nodeID, Reason: "nodetrust-load revocation fan-out"})
			switch {
			case err != nil:
				p.failed(fmt.Errorf("RevokeNode: %w", rpcError(err, nil)))
			case !resp.SessionNotified && !strings.Contains(r.cp.addr, ","):
				// With several replicas the session may be on another,
				// which the revocation reaches through the store.
				p.failed(errors.New("RevokeNode: the server found no live session to notify"))
			}
		})
		wg.Wait()
	})
	return res, targets
}

// checks makes the run's correctness checks.
func (r *runner) checks(joinFailures *failures, renewPins []pki.Pin, renewFailures []string, revoked []*simNode) []Check {
	var out []Check
	joined, held := 0, 0
	for _, n := range r.nodes {
		if n.joined {
			joined++
		}
		if n.sess != nil {
			held++
		}
	}
	detail := fmt.Sprintf("%d of %d joined, each answer checked as a node checks it", joined, len(r.nodes))
	if s := joinFailures.String(); s != "" {
		detail += "; " + s
	}
	out = append(out, Check{Name: "every node joined", OK: joined == len(r.nodes), Detail: detail})
	out = append(out, Check{Name: "every joined node held a live session", OK: held == joined && joined > 0,
		Detail: fmt.Sprintf("%d of %d joined nodes were welcomed", held, joined)})

	if r.c.Renewals > 0 {
		want := held * r.c.Renewals
		seen := map[pki.Pin]bool{}
		for _, n := range r.nodes {
			if n.key != nil {
				if pin, err := pki.PinOf(n.key.Public()); err == nil {
					seen[pin] = true
				}
			}
		}
		dups := 0
		for _, p := range renewPins {
			if seen[p] {
				dups++
			}
			seen[p] = true
		}
		ok := len(renewPins) == want && dups == 0 && len(renewFailures) == 0
		detail := fmt.Sprintf("%d of %d renewals certified their new key; %d key pins distinct, %d repeated", len(renewPins), want, len(seen), dups)
		if len(renewFailures) > 0 {
			detail += "; " + strings.Join(renewFailures, "; ")
		}
		out = append(out, Check{Name: "every renewal certified a new key", OK: ok, Detail: detail})
	}

	if r.c.Revoke > 0 {
		f := &failures{}
		expired := make(chan struct{})
		t := time.AfterFunc(r.c.Timeout, func() { close(expired) })
		defer t.Stop()
		for _, n := range revoked {
			if !n.sess.hasNotice() {
				f.add("node %s got no RevocationNotice", n.nodeID)
				continue
			}
			select {
			case <-n.sess.ended:
			case <-expired:
				f.add("node %s's session was not ended within %s of the revocations", n.nodeID, r.c.Timeout)
			}
		}
		detail := fmt.Sprintf("%d of %d revoked sessions received their notice and ended", len(revoked)-f.n, len(revoked))
		if s := f.String(); s != "" {
			detail += "; " + s
		}
		out = append(out, Check{Name: "every revoked session received its notice and ended", OK: f.n == 0 && len(revoked) == r.c.Revoke, Detail: detail})
	}

	f := &failures{}
	others := 0
	for _, n := range r.nodes {
		if n.sess == nil || n.revoked {
			continue
		}
		others++
		if n.sess.isEnded() {
			f.add("node %s's session ended: %v", n.nodeID, n.sess.endErr)
		} else if n.sess.hasNotice() {
			f.add("node %s got a RevocationNotice", n.nodeID)
		}
	}
	detail = fmt.Sprintf("%d sessions not revoked, %d ended", others, f.n)
	if s := f.String(); s != "" {
		detail += "; " + s
	}
	out = append(out, Check{Name: "no session that was not revoked ended", OK: f.n == 0, Detail: detail})
	return out
}

// closeSessions ends every session the tool holds.
func (r *runner) closeSessions() {
	for _, n := range r.nodes {
		if n.sess != nil && !n.sess.closing.Load() {
			n.sess.close()
		}
	}
}
