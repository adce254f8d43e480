package service

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/logkey"
)

// ignoredReplaced: a nonce of the same purpose was asked again before the
// first was answered.
const ignoredReplaced = "replaced"

// maxPCRIndex is the highest PCR a TPM 2.0 PC client has.
const maxPCRIndex = 23

// checkOutcome is what came of one boot check.
type checkOutcome struct {
	verdict *bootpolicy.Verdict
	action  string
	err     error
}

// issuedNonce is a nonce a session gave and awaits evidence over: single
// use, bound to the session (and so to its node), valid until notAfter.
type issuedNonce struct {
	nonce    []byte
	purpose  gatewayv1.NoncePurpose
	notAfter time.Time
	// waiter, when set, is told the outcome (a CheckNode call); buffered.
	waiter chan checkOutcome
}

// nonceBook holds a session's open nonces, one per purpose. It is safe
// for concurrent use: the session's reader takes nonces, a CheckNode call
// issues one, and its timer expires them.
type nonceBook struct {
	mu   sync.Mutex
	open []*issuedNonce
	// onExpire, when set, is told of the nonces that expired unanswered,
	// from a timer's goroutine; the book arms its timer only then.
	onExpire func([]*issuedNonce)
	timer    *time.Timer
	closed   bool
}

// issue makes a fresh nonce for purpose; one still open for the same
// purpose is dropped (returned, so the caller counts it).
func (b *nonceBook) issue(purpose gatewayv1.NoncePurpose, notAfter time.Time, waiter chan checkOutcome) (n, dropped *issuedNonce, err error) {
	nonce := make([]byte, nonceSize)
	if _, err := rand.Read(nonce); err != nil {
		return nil, nil, fmt.Errorf("read random: %w", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil, nil, errSessionEnded
	}
	for i, o := range b.open {
		if o.purpose == purpose {
			dropped = o
			b.open = append(b.open[:i], b.open[i+1:]...)
			break
		}
	}
	n = &issuedNonce{nonce: nonce, purpose: purpose, notAfter: notAfter, waiter: waiter}
	b.open = append(b.open, n)
	b.armLocked(time.Now())
	return n, dropped, nil
}

// take removes and returns the open nonce equal to nonce, of purpose, if
// it has not expired at now.
func (b *nonceBook) take(nonce []byte, purpose gatewayv1.NoncePurpose, now time.Time) (*issuedNonce, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, o := range b.open {
		if o.purpose == purpose && len(nonce) == len(o.nonce) && subtle.ConstantTimeCompare(o.nonce, nonce) == 1 {
			b.open = append(b.open[:i], b.open[i+1:]...)
			return o, now.Before(o.notAfter)
		}
	}
	return nil, false
}

// expireLocked removes and returns the nonces past their time at now.
func (b *nonceBook) expireLocked(now time.Time) []*issuedNonce {
	var gone []*issuedNonce
	kept := b.open[:0]
	for _, o := range b.open {
		if now.Before(o.notAfter) {
			kept = append(kept, o)
		} else {
			gone = append(gone, o)
		}
	}
	b.open = kept
	return gone
}

// armLocked sets the timer to fire when the first open nonce expires. A
// timer rather than a goroutine: a held session has none of its own.
func (b *nonceBook) armLocked(now time.Time) {
	if b.onExpire == nil || b.closed || len(b.open) == 0 {
		return
	}
	first := b.open[0].notAfter
	for _, o := range b.open[1:] {
		if o.notAfter.Before(first) {
			first = o.notAfter
		}
	}
	d := max(first.Sub(now), 0)
	if b.timer == nil {
		b.timer = time.AfterFunc(d, b.fire)
		return
	}
	b.timer.Reset(d)
}

// fire expires the nonces whose time passed and re-arms for the rest.
func (b *nonceBook) fire() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	now := time.Now()
	gone := b.expireLocked(now)
	b.armLocked(now)
	b.mu.Unlock()
	if len(gone) > 0 {
		b.onExpire(gone)
	}
}

// close stops the timer and returns the nonces still open: the session
// ended before they were answered.
func (b *nonceBook) close() []*issuedNonce {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.timer != nil {
		b.timer.Stop()
	}
	open := b.open
	b.open = nil
	return open
}

// unanswered counts and reports the nonces that got no evidence.
func (s *Server) unanswered(ctx context.Context, nodeID, reason string, ns []*issuedNonce) {
	for _, n := range ns {
		s.boot.ignore(reason)
		s.log.InfoContext(ctx, "boot evidence not received: not evidence, nothing changes", logkey.NodeID, nodeID, logkey.Reason, reason,
			"purpose", n.purpose.String())
		if n.waiter != nil {
			n.waiter <- checkOutcome{err: &notEvidence{reason: reason, err: errors.New("the node did not answer with boot evidence")}}
		}
	}
}

// giveNonce gives the node a nonce to answer with evidence: the answer
// to a NonceRequest (id is the request's) or a check the server asks for
// (id 0: the caller numbers it).
func (s *Server) giveNonce(book *nonceBook, purpose gatewayv1.NoncePurpose, waiter chan checkOutcome) (*gatewayv1.BootNonce, *issuedNonce, error) {
	// Real time, not the injected clock: the deadline is a timer's.
	n, dropped, err := book.issue(purpose, time.Now().Add(s.cfg.BootCheckTimeout), waiter)
	if err != nil {
		return nil, nil, err
	}
	return &gatewayv1.BootNonce{Nonce: n.nonce, Purpose: purpose, NotAfterUnixNano: n.notAfter.UnixNano()}, dropped, nil
}

// nonceRequest answers a node's NonceRequest.
func (s *Server) nonceRequest(ctx context.Context, caller *authedNode, book *nonceBook, req *gatewayv1.NonceRequest) (*gatewayv1.BootNonce, error) {
	switch req.Purpose {
	case gatewayv1.NoncePurpose_NONCE_PURPOSE_BOOT_CHECK:
		if s.cfg.BootPolicy == nil {
			return nil, refused(codes.FailedPrecondition, "fleetd has no [boot_policy]: boot checks are off")
		}
	case gatewayv1.NoncePurpose_NONCE_PURPOSE_RENEWAL:
	default:
		return nil, refused(codes.InvalidArgument, "a nonce for an unknown purpose")
	}
	if len(caller.info.TPMAKName) == 0 {
		return nil, refused(codes.FailedPrecondition, "the certificate names no TPM AK: there is no boot evidence to give")
	}
	bn, dropped, err := s.giveNonce(book, req.Purpose, nil)
	if err != nil {
		return nil, err
	}
	if dropped != nil {
		s.unanswered(ctx, caller.node.ID, ignoredReplaced, []*issuedNonce{dropped})
	}
	return bn, nil
}

// bootEvidence judges boot evidence that answers one of the session's
// nonces, and acts on a failed verdict.
func (s *Server) bootEvidence(ctx context.Context, caller *authedNode, book *nonceBook, ev *gatewayv1.BootEvidence) *gatewayv1.BootCheckResult {
	in, ok := book.take(ev.Nonce, gatewayv1.NoncePurpose_NONCE_PURPOSE_BOOT_CHECK, time.Now())
	var out checkOutcome
	switch {
	case in == nil:
		s.boot.ignore(ignoredUnknownNonce)
		return &gatewayv1.BootCheckResult{Result: "not-evaluated", Detail: "unknown or spent nonce: ask for a fresh one"}
	case !ok:
		s.boot.ignore(ignoredExpired)
		out.err = &notEvidence{reason: ignoredExpired, err: errors.New("the evidence came after the nonce expired")}
	default:
		out = s.bootCheck(ctx, caller, ev, in.nonce)
	}
	if in.waiter != nil {
		in.waiter <- out
	}
	if out.err != nil {
		return &gatewayv1.BootCheckResult{Result: "not-evaluated", Detail: out.err.Error()}
	}
	return &gatewayv1.BootCheckResult{Result: out.verdict.Result, Failed: out.verdict.Failed, Detail: out.action}
}

// evidenceOf checks that ev is a quote by the AK the caller's certificate
// names and returns it as bootpolicy's evidence over nonce; a *notEvidence
// (counted) otherwise.
func (s *Server) evidenceOf(ctx context.Context, caller *authedNode, akName []byte, ev *gatewayv1.BootEvidence, nonce []byte) (bootpolicy.Evidence, error) {
	ignore := func(reason, format string, args ...any) (bootpolicy.Evidence, error) {
		s.boot.ignore(reason)
		return bootpolicy.Evidence{}, &notEvidence{reason: reason, err: fmt.Errorf(format, args...)}
	}
	switch {
	case ev.Error != "":
		s.log.InfoContext(ctx, "the node could not give boot evidence", logkey.NodeID, caller.node.ID, logkey.Error, capClaim(ev.Error))
		return ignore(ignoredNodeError, "the node could not quote its boot: %s", capClaim(ev.Error))
	case len(akName) == 0:
		return ignore(ignoredNoAK, "the certificate names no TPM AK")
	}
	name, err := attest.AKName(ev.AkPublic)
	if err != nil {
		return ignore(ignoredWrongAK, "AK public area: %v", err)
	}
	if !bytes.Equal(name, akName) {
		return ignore(ignoredWrongAK, "the quote is by AK %x, the certificate names AK %x", name, akName)
	}
	pcrs := make(map[int][]byte, len(ev.Pcrs))
	for i, v := range ev.Pcrs {
		if i > maxPCRIndex {
			return ignore(ignoredIncomplete, "PCR %d does not exist", i)
		}
		pcrs[int(i)] = v
	}
	return bootpolicy.Evidence{
		Quote: &bootpolicy.Quote{AKPublic: ev.AkPublic, Attest: ev.QuoteAttest, Signature: ev.QuoteSignature, Nonce: nonce},
		PCRs:  pcrs, EventLog: ev.EventLog,
	}, nil
}

// bootCheck judges a running node's boot evidence (stage boot-check) and
// acts on a failed verdict once it is stored.
func (s *Server) bootCheck(ctx context.Context, caller *authedNode, ev *gatewayv1.BootEvidence, nonce []byte) checkOutcome {
	e, err := s.evidenceOf(ctx, caller, caller.info.TPMAKName, ev, nonce)
	if err != nil {
		return checkOutcome{err: err}
	}
	n, err := s.cfg.Store.GetNode(ctx, caller.node.ID)
	if err != nil {
		s.boot.ignore(ignoredStore)
		return checkOutcome{err: fmt.Errorf("look up node %s: %w", caller.node.ID, err)}
	}
	if err := s.lakQuote(ctx, n, caller.info.TPMAKName); err != nil {
		return checkOutcome{err: err}
	}
	v, err := s.judgeBoot(ctx, n.ID, classOf(n.Class), bootpolicy.BootCheck, e)
	if err != nil {
		return checkOutcome{err: err}
	}
	s.keepEvidence(ctx, n.ID, v, e)
	if v.Pass() {
		return checkOutcome{verdict: v, action: actionNone}
	}
	return checkOutcome{verdict: v, action: s.actOnFailure(ctx, n, v)}
}

// attestedRenewal is the boot evidence a renewal carries, over a nonce of
// purpose renewal the session gave.
type attestedRenewal struct {
	ev    *gatewayv1.BootEvidence
	nonce []byte
}

// renewalBoot judges the boot evidence of a renewal of a certificate that
// names an AK (stage renewal). A failed verdict refuses the renewal and
// quarantines the node; a control-plane class only alerts, and renews.
func (s *Server) renewalBoot(ctx context.Context, cur *authedNode, keyAK []byte, att *attestedRenewal) error {
	// The session's record of the node may be older than a quarantine: a
	// node that does not renew is refused before its evidence is judged,
	// so retries store no verdicts.
	n, err := s.cfg.Store.GetNode(ctx, cur.node.ID)
	if err != nil {
		return unavailable("renewal", "renewal could not be checked; retry", fmt.Errorf("get node: %w", err), logkey.NodeID, cur.node.ID)
	}
	if n.Generation == cur.node.Generation && !lifecycle.May(n.State, lifecycle.Renew) {
		return notRenewing(n)
	}
	if att == nil {
		return refused(codes.FailedPrecondition, "the certificate names a TPM AK and fleetd checks boot policy: renew on the live session with a quote over a fresh nonce (bcd node does)")
	}
	if att.nonce == nil {
		return refused(codes.FailedPrecondition, "the renewal's nonce is unknown, spent or expired: ask for a fresh one")
	}
	if !bytes.Equal(att.ev.AkPublic, keyAK) {
		s.boot.ignore(ignoredWrongAK)
		return refused(codes.PermissionDenied, "the renewal's quote and its key certification are by different AKs")
	}
	e, err := s.evidenceOf(ctx, cur, cur.info.TPMAKName, att.ev, att.nonce)
	if err != nil {
		return refused(codes.FailedPrecondition, "renewal waits: %v", err)
	}
	if err := s.lakQuote(ctx, n, cur.info.TPMAKName); err != nil {
		return refused(codes.PermissionDenied, "renewal refused: %v", err)
	}
	v, err := s.judgeBoot(ctx, n.ID, classOf(n.Class), bootpolicy.Renewal, e)
	var ne *notEvidence
	switch {
	case errors.As(err, &ne):
		return refused(codes.FailedPrecondition, "renewal waits: %v", err)
	case err != nil:
		return unavailable("renewal", "the boot verdict could not be stored; retry", err, logkey.NodeID, cur.node.ID)
	}
	s.keepEvidence(ctx, n.ID, v, e)
	if v.Pass() {
		return nil
	}
	switch s.actOnFailure(ctx, n, v) {
	case actionAlerted, actionAudited, actionWarned:
		return nil
	}
	return refused(codes.PermissionDenied, "the boot fails the %s boot policy at renewal: %s; node %s is quarantined until fleetd nodes release %s",
		classOf(n.Class), failedSummary(v), n.ID, n.ID)
}

// checkCall is a CheckNode waiting for a session's boot check.
type checkCall struct {
	result chan checkOutcome
}

func (a *adminService) CheckNode(ctx context.Context, req *adminv1.CheckNodeRequest) (*adminv1.CheckNodeResponse, error) {
	s := a.s
	if s.cfg.BootPolicy == nil {
		return nil, refused(codes.FailedPrecondition, "fleetd has no [boot_policy]: boot checks are off (docs/boot-policy.md)")
	}
	sess := s.sessions.get(req.NodeId)
	if sess == nil {
		return nil, refused(codes.Unavailable, "node %s has no live session on this server (another replica may hold it; fleetd nodes show %s)", req.NodeId, req.NodeId)
	}
	call := &checkCall{result: make(chan checkOutcome, 1)}
	wait := time.NewTimer(s.cfg.BootCheckTimeout + 5*time.Second)
	defer wait.Stop()
	if !sess.check(call) {
		return nil, refused(codes.Unavailable, "node %s's session ended before the check", req.NodeId)
	}
	var out checkOutcome
	select {
	case out = <-call.result:
	case <-wait.C:
		return nil, refused(codes.Unavailable, "node %s did not answer in time: not evidence, nothing changed", req.NodeId)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	var ne *notEvidence
	switch {
	case errors.As(out.err, &ne):
		return nil, refused(codes.Unavailable, "node %s gave no boot evidence (%v): not evidence, nothing changed", req.NodeId, out.err)
	case out.err != nil:
		return nil, storeFailure("boot check of node "+req.NodeId, out.err)
	}
	v := out.verdict
	sv := storedVerdict(v)
	sv.NodeID = req.NodeId
	return &adminv1.CheckNodeResponse{Verdict: verdictInfo(sv), Action: out.action}, nil
}
