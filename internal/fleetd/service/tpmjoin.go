package service

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
)

// Limits of the tpm attestor's challenge.
const (
	// MaxChallengeRounds is the most JoinChallenge rounds one tpm join
	// gets; a wrong answer in the last is a refusal.
	MaxChallengeRounds = 3
	// maxOpenChallenges bounds the challenges held in the store, so
	// requests cannot grow it without limit.
	maxOpenChallenges = 65536
	nonceSize         = 32
)

// challenge is one open round of a tpm join, held in the store until its
// answer, which may come back to another replica.
type challenge struct {
	id       string
	round    uint32
	notAfter time.Time
	nonce    []byte
	cred     *attest.Challenge
	csrHash  []byte
	ev       *joinv1.TpmEvidence
	ekPin    string
	akName   []byte
	known    *store.Node // the node this EK already belongs to, if any
	// pendingID is the approved pending join this round proves the TPM
	// for again, when the token required approval.
	pendingID string
	// purpose is purposeIntake for a round of an intake, empty for a
	// join's: an answer is taken only by the call that asked.
	purpose string
}

// challengeState is a round as the store keeps it (store.Challenge.State).
// The node the EK belongs to is kept by id and read again with the answer.
type challengeState struct {
	Round           uint32 `json:"round"`
	Nonce           []byte `json:"nonce"`
	Secret          []byte `json:"secret"`
	CredentialBlob  []byte `json:"credential_blob"`
	EncryptedSecret []byte `json:"encrypted_secret"`
	AKNameBound     []byte `json:"ak_name_bound"`
	CSRHash         []byte `json:"csr_hash"`
	Evidence        []byte `json:"evidence"` // a joinv1.TpmEvidence
	EKPin           string `json:"ek_pin"`
	AKName          []byte `json:"ak_name"`
	KnownNode       string `json:"known_node,omitempty"`
	PendingID       string `json:"pending_id,omitempty"`
	Purpose         string `json:"purpose,omitempty"`
}

// putChallenge stores an open round.
func (s *Server) putChallenge(ctx context.Context, ch *challenge, now time.Time) error {
	ev, err := proto.Marshal(ch.ev)
	if err != nil {
		return fmt.Errorf("encode the challenge's evidence: %w", err)
	}
	st := challengeState{
		Round: ch.round, Nonce: ch.nonce, Secret: ch.cred.Secret, CredentialBlob: ch.cred.CredentialBlob,
		EncryptedSecret: ch.cred.EncryptedSecret, AKNameBound: ch.cred.AKName,
		CSRHash: ch.csrHash, Evidence: ev, EKPin: ch.ekPin, AKName: ch.akName, PendingID: ch.pendingID,
		Purpose: ch.purpose,
	}
	if ch.known != nil {
		st.KnownNode = ch.known.ID
	}
	b, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("encode the challenge: %w", err)
	}
	err = s.cfg.Store.PutChallenge(ctx, store.Challenge{ID: ch.id, NotAfter: ch.notAfter, State: b}, now, maxOpenChallenges)
	if errors.Is(err, store.ErrConflict) {
		return fmt.Errorf("too many open TPM challenges: %w", err)
	}
	return err
}

// takeChallenge takes the round id out of the store, so its answer cannot
// be replayed; nil when there is no such round.
func (s *Server) takeChallenge(ctx context.Context, id string) (*challenge, error) {
	c, err := s.cfg.Store.TakeChallenge(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("look up the challenge: %w", err)
	}
	var st challengeState
	if err := json.Unmarshal(c.State, &st); err != nil {
		return nil, fmt.Errorf("decode challenge %s: %w", id, err)
	}
	ev := &joinv1.TpmEvidence{}
	if err := proto.Unmarshal(st.Evidence, ev); err != nil {
		return nil, fmt.Errorf("decode challenge %s: %w", id, err)
	}
	ch := &challenge{
		id: c.ID, round: st.Round, notAfter: c.NotAfter, nonce: st.Nonce,
		cred:    &attest.Challenge{Secret: st.Secret, CredentialBlob: st.CredentialBlob, EncryptedSecret: st.EncryptedSecret, AKName: st.AKNameBound},
		csrHash: st.CSRHash, ev: ev, ekPin: st.EKPin, akName: st.AKName, pendingID: st.PendingID,
		purpose: st.Purpose,
	}
	if st.KnownNode != "" {
		n, err := s.cfg.Store.GetNode(ctx, st.KnownNode)
		switch {
		case err == nil && n.EKPin == st.EKPin:
			ch.known = &n
		case err != nil && !errors.Is(err, store.ErrNotFound):
			return nil, fmt.Errorf("look up node %s of the challenge: %w", st.KnownNode, err)
		}
	}
	return ch, nil
}

// joinTPM runs the tpm attestor (seed 003, "Attestation and admission"):
// the first request proves nothing yet and gets a challenge bound to its
// EK and AK; the answer proves the AK is in that EK's TPM and quotes the
// boot over a fresh nonce. A known EK reclaims its node without a token; an
// unknown one needs a token as well. A token piped with a known EK is
// spent, and its role and site replace the node's. A token that requires
// approval makes the proven join wait (JoinPending); once approved, the
// next request gets a fresh challenge round, so the TPM proves itself and
// its boot again at the moment the certificate is issued.
func (j *joinService) joinTPM(ctx context.Context, req *joinv1.JoinRequest, csr *x509.CertificateRequest, csrHash []byte) (*joinv1.JoinResponse, error) {
	if req.DeferralId == "" {
		return j.tpmRound1(ctx, req, csr, csrHash, "")
	}
	s := j.s
	ch, err := s.takeChallenge(ctx, req.DeferralId)
	if err != nil {
		return nil, err
	}
	if ch == nil {
		return j.tpmPending(ctx, req, csr, csrHash)
	}
	now := s.cfg.Now()
	switch {
	case ch.purpose != "":
		return nil, refuse(reasonTPMChallenge, "the deferral is a round of an intake, not of a join")
	case !now.Before(ch.notAfter):
		return nil, refuse(reasonTPMChallenge, "challenge round %d expired at %s", ch.round, ch.notAfter.UTC().Format(time.RFC3339))
	case !bytes.Equal(ch.csrHash, csrHash):
		return nil, refuse(reasonTPMChallenge, "the answer is for another CSR than the challenge")
	case req.Answer == nil || req.Answer.Round != ch.round:
		return nil, refuse(reasonTPMChallenge, "no answer to challenge round %d", ch.round)
	}
	if err := j.checkAnswer(ch, req.Answer); err != nil {
		if ch.round >= MaxChallengeRounds {
			return nil, refuse(reasonTPMChallenge, "challenge round %d failed, the last: %v", ch.round, err)
		}
		s.log.WarnContext(ctx, "tpm challenge failed, asking again", "round", ch.round, logkey.EKPin, ch.ekPin, logkey.Reason, err.Error())
		return j.newRound(ctx, ch, ch.round+1)
	}
	var boot *judgedBoot
	if j.s.cfg.BootPolicy != nil {
		if boot, err = j.intakeBoot(ctx, ch, req.Answer); err != nil {
			return nil, err
		}
	}
	return j.tpmProven(ctx, req, ch, csr, csrHash, boot)
}

// tpmProven decides a tpm join whose TPM answered its challenge.
func (j *joinService) tpmProven(ctx context.Context, req *joinv1.JoinRequest, ch *challenge, csr *x509.CertificateRequest, csrHash []byte, boot *judgedBoot) (*joinv1.JoinResponse, error) {
	claims := claimsFrom(req.Claims)
	var o *openedToken
	if len(req.SealedToken) > 0 {
		var err error
		if o, err = j.openToken(ctx, req, csrHash); err != nil {
			return nil, err
		}
	}
	asked := req.NodeId
	if ch.pendingID != "" && o != nil {
		// The node id the pending join was approved for.
		p, err := j.pendingFor(ctx, ch.pendingID, o, csrHash)
		if err != nil {
			return nil, err
		}
		asked = p.NodeID
	}
	r := lifecycle.Request{Attestor: "tpm", EKPin: ch.ekPin, Claims: claims, AskedNodeID: asked}
	if o != nil {
		r.Token = &o.tok
	}
	pl, err := j.place(ctx, r, o)
	if err != nil {
		return nil, err
	}
	lakName, err := j.joinLAK(ctx, ch, pl)
	if err != nil {
		return nil, err
	}
	in := issuance{token: o, placement: pl, attestor: "tpm", claims: claims, ekPin: ch.ekPin, akName: ch.akName, lakName: lakName,
		csr: csr, csrHash: csrHash, daemonVersion: req.DaemonVersion, boot: boot}
	if o == nil || !o.tok.RequireApproval {
		return j.issue(ctx, in)
	}
	return j.tpmApproval(ctx, ch, o, in)
}

// tpmApproval holds a proven tpm join whose token requires approval: the
// first time it stores the pending join and answers JoinPending; in the
// round that follows the approval it issues.
func (j *joinService) tpmApproval(ctx context.Context, ch *challenge, o *openedToken, in issuance) (*joinv1.JoinResponse, error) {
	s := j.s
	now := s.cfg.Now()
	if ch.pendingID == "" {
		p := store.Pending{
			ID: randomHex(16), TokenHash: o.hash, TokenID: o.tok.ID, CSRHash: in.csrHash,
			NodeID: in.nodeID, Role: in.role, Site: in.site, Claims: in.claims,
			CreatedAt: now, ExpiresAt: o.tok.ExpiresAt,
		}
		if err := s.cfg.Store.CreatePending(ctx, p); err != nil {
			return nil, fmt.Errorf("store pending join of node %s: %w", in.nodeID, err)
		}
		s.log.InfoContext(ctx, "join waiting for approval", logkey.NodeID, in.nodeID, logkey.TokenID, o.tok.ID,
			logkey.Attestor, "tpm", logkey.EKPin, ch.ekPin, logkey.Peer, peerAddr(ctx))
		return pendingResponse(s, p), nil
	}
	p, err := j.pendingFor(ctx, ch.pendingID, o, in.csrHash)
	if err != nil {
		return nil, err
	}
	switch {
	case p.ApprovedAt.IsZero():
		return pendingResponse(s, p), nil
	case p.NodeID != in.nodeID:
		return nil, o.deny(reasonDeferral, "the pending join was for node %s, it would now be node %s", p.NodeID, in.nodeID)
	}
	in.pendingID = p.ID
	return j.issue(ctx, in)
}

// tpmPending answers a tpm join that comes back with the id of its pending
// join: still waiting, or, once approved, a fresh challenge round.
func (j *joinService) tpmPending(ctx context.Context, req *joinv1.JoinRequest, csr *x509.CertificateRequest, csrHash []byte) (*joinv1.JoinResponse, error) {
	if len(req.SealedToken) == 0 {
		return nil, refuse(reasonTPMChallenge, "unknown or already answered challenge")
	}
	o, err := j.openToken(ctx, req, csrHash)
	if err != nil {
		return nil, err
	}
	p, err := j.pendingFor(ctx, req.DeferralId, o, csrHash)
	if err != nil {
		return nil, err
	}
	if p.ApprovedAt.IsZero() {
		return pendingResponse(j.s, p), nil
	}
	return j.tpmRound1(ctx, req, csr, csrHash, p.ID)
}

// pendingFor returns the pending join id after checking it is the one of
// this token and CSR and has not expired.
func (j *joinService) pendingFor(ctx context.Context, id string, o *openedToken, csrHash []byte) (store.Pending, error) {
	p, err := j.s.cfg.Store.GetPending(ctx, id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return p, o.deny(reasonDeferral, "unknown deferral (or a challenge already answered)")
	case err != nil:
		return p, fmt.Errorf("look up deferral: %w", err)
	case !bytes.Equal(p.CSRHash, csrHash) || !bytes.Equal(p.TokenHash, o.hash):
		return p, o.deny(reasonDeferral, "the deferral belongs to another request")
	case !j.s.cfg.Now().Before(p.ExpiresAt):
		return p, o.deny(reasonDeferral, "the pending join expired at %s", p.ExpiresAt.UTC().Format(time.RFC3339))
	}
	return p, nil
}

// tpmRound1 checks the evidence that needs no challenge — the EK, the
// AK's attributes and its certification of the CSR's key — and answers
// with round 1.
func (j *joinService) tpmRound1(ctx context.Context, req *joinv1.JoinRequest, csr *x509.CertificateRequest, csrHash []byte, pendingID string) (*joinv1.JoinResponse, error) {
	s := j.s
	ev := req.Tpm
	if ev == nil {
		return nil, refuse(reasonTPMEvidence, "tpm attestor without TPM evidence")
	}
	if len(ev.LakChain) > maxLAKChain {
		// Bounded before the evidence is held with the challenge; the
		// chain is checked once the join is placed (joinLAK).
		return nil, refuse(reasonLAK, "rule %s: the LAK chain has %d certificates, want 1 to %d", RuleLAKChain, len(ev.LakChain), maxLAKChain)
	}
	ekPub, err := attest.EKPublic(ev.EkPublic)
	if err != nil {
		return nil, refuse(reasonTPMEvidence, "EK public area: %v", err)
	}
	ekPin, err := attest.EKPin(ekPub)
	if err != nil {
		return nil, refuse(reasonTPMEvidence, "EK: %v", err)
	}
	var known *store.Node
	n, err := s.cfg.Store.NodeByEKPin(ctx, ekPin)
	switch {
	case err == nil:
		known = &n
	case !errors.Is(err, store.ErrNotFound):
		return nil, fmt.Errorf("look up EK %s: %w", ekPin, err)
	}
	both := s.cfg.RequireEKCertificateAndPin
	if known == nil || both {
		why := "the TPM has no EK certificate"
		if len(ev.EkCertificate) > 0 {
			why = "no manufacturer roots are configured"
			if s.cfg.EKVerifier != nil {
				// The chain the node read from its TPM's NV only helps
				// build a path to a configured root; it is never trusted
				// by itself.
				_, err := s.cfg.EKVerifier.VerifyEKCertificateChain(ev.EkCertificate, ev.EkChain, ekPub)
				why = ""
				if err != nil {
					why = err.Error()
				}
			}
		}
		if both && why != "" {
			return nil, refuse(reasonTPMEvidence, "EK %s: its certificate is not trusted (%s), and tpm.require_ek_certificate_and_pin wants a trusted certificate as well as a known EK", ekPin, why)
		}
		if known == nil && (why != "" || both) {
			// An EK a declaration binds is known too; whether its binding
			// is honoured is decided after the TPM proved it.
			bound, err := s.cfg.Inventory.ByEKPin(ctx, ekPin)
			if err != nil {
				return nil, refuse(reasonTPMEvidence, "unknown EK %s, and the inventory source cannot answer: %v", ekPin, err)
			}
			if len(bound) == 0 {
				if both {
					return nil, refuse(reasonTPMEvidence, "unknown EK %s: its certificate is trusted, but tpm.require_ek_certificate_and_pin wants the EK pinned for a node or bound by a declaration as well", ekPin)
				}
				return nil, refuse(reasonTPMEvidence, "unknown EK %s: not pinned for any node, and its certificate is not trusted (%s); no declaration binds it", ekPin, why)
			}
		}
	}
	keyPub, err := attest.VerifyCertify(ev.AkPublic, ev.CertifyAttest, ev.CertifySignature, ev.NodeKeyPublic, csrHash)
	if err != nil {
		return nil, refuse(reasonTPMEvidence, "the AK's certification of the node key: %v", err)
	}
	if !samePublicKey(keyPub, csr.PublicKey) {
		return nil, refuse(reasonTPMEvidence, "the AK certified another key than the CSR's")
	}
	akName, err := attest.AKName(ev.AkPublic)
	if err != nil {
		return nil, refuse(reasonTPMEvidence, "AK: %v", err)
	}
	ch := &challenge{csrHash: csrHash, ev: ev, ekPin: ekPin, akName: akName, known: known, pendingID: pendingID}
	return j.newRound(ctx, ch, 1)
}

// newRound makes a fresh credential and nonce for round and holds it.
func (j *joinService) newRound(ctx context.Context, prev *challenge, round uint32) (*joinv1.JoinResponse, error) {
	s := j.s
	cred, err := attest.NewChallenge(prev.ev.EkPublic, prev.ev.AkPublic, rand.Reader)
	if err != nil {
		return nil, refuse(reasonTPMEvidence, "make the credential challenge: %v", err)
	}
	nonce := make([]byte, nonceSize)
	if _, err := rand.Read(nonce); err != nil {
		return nil, fmt.Errorf("read random: %w", err)
	}
	now := s.cfg.Now()
	ch := *prev
	ch.id, ch.round, ch.notAfter, ch.nonce, ch.cred = randomHex(16), round, now.Add(s.cfg.ChallengeTTL), nonce, cred
	if err := s.putChallenge(ctx, &ch, now); err != nil {
		return nil, err
	}
	s.log.InfoContext(ctx, "tpm challenge", "round", round, logkey.EKPin, ch.ekPin, "known_node", ch.known != nil, logkey.Peer, peerAddr(ctx))
	return &joinv1.JoinResponse{Result: &joinv1.JoinResponse_Challenge{Challenge: &joinv1.JoinChallenge{
		DeferralId:       ch.id,
		Round:            round,
		NotAfterUnixNano: ch.notAfter.UnixNano(),
		Nonce:            nonce,
		CredentialBlob:   cred.CredentialBlob,
		EncryptedSecret:  cred.EncryptedSecret,
	}}}, nil
}

// checkAnswer checks the activated secret, the quote over the round's
// nonce and, without boot policy, the event log against the quoted PCRs
// (with boot policy, intakeBoot judges the log).
func (j *joinService) checkAnswer(ch *challenge, a *joinv1.ChallengeAnswer) error {
	if err := ch.cred.Check(a.ActivatedSecret); err != nil {
		return err
	}
	pcrs := make(map[int][]byte, len(a.Pcrs))
	for i, v := range a.Pcrs {
		if i > 23 {
			return fmt.Errorf("PCR %d does not exist", i)
		}
		pcrs[int(i)] = v
	}
	if err := attest.VerifyQuote(ch.ev.AkPublic, a.QuoteAttest, a.QuoteSignature, ch.nonce, pcrs); err != nil {
		return err
	}
	if j.s.cfg.BootPolicy != nil {
		return nil
	}
	if _, err := attest.ReplayEventLog(a.EventLog, pcrs); err != nil {
		return err
	}
	return nil
}

func samePublicKey(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}

// judgedBoot is a tpm join's verdict and the evidence it was made of:
// issue keeps the evidence under the node id it issues to, once the join
// is recorded (a refused join keeps none, whatever node id its EK's
// declaration names).
type judgedBoot struct {
	verdict  *bootpolicy.Verdict
	evidence bootpolicy.Evidence
}

// intakeBoot judges the boot a proven tpm join quoted against the policy of
// the machine's class (the class of its node, else of the declaration that
// binds its EK, else worker) and stores the verdict: at intake for a first
// join (or one of a planned or provisioning node), at renewal's stage for
// an installed node that re-joins. A
// failed verdict refuses the join, every failed rule in the log and the
// audit trail. A verdict that admits the join comes back as a
// judgedBoot, whose evidence the issue keeps.
func (j *joinService) intakeBoot(ctx context.Context, ch *challenge, a *joinv1.ChallengeAnswer) (*judgedBoot, error) {
	s := j.s
	nodeID, class, stage := "", "", bootpolicy.Intake
	if ch.known != nil {
		nodeID, class = ch.known.ID, ch.known.Class
		if ch.known.State != store.StatePlanned && ch.known.State != store.StateProvisioning {
			// A node that was installed re-joins from its installed
			// boot: the authorities required at renewal apply.
			stage = bootpolicy.Renewal
		}
	} else {
		// The declaration that binds the EK names the class to judge by;
		// a source that cannot answer must not leave it to the default.
		decls, err := s.cfg.Inventory.ByEKPin(ctx, ch.ekPin)
		if err != nil {
			return nil, refuse(reasonTPMEvidence, "EK %s: the inventory source cannot say which class's boot policy applies: %v", ch.ekPin, err)
		}
		if len(decls) == 1 {
			nodeID, class = decls[0].Name, decls[0].Class
		}
	}
	class = classOf(class)
	pcrs := make(map[int][]byte, len(a.Pcrs))
	for i, v := range a.Pcrs {
		pcrs[int(i)] = v
	}
	ev := bootpolicy.Evidence{
		Quote:    &bootpolicy.Quote{AKPublic: ch.ev.AkPublic, Attest: a.QuoteAttest, Signature: a.QuoteSignature, Nonce: ch.nonce},
		PCRs:     pcrs,
		EventLog: a.EventLog,
	}
	v, err := s.judgeBoot(ctx, nodeID, class, stage, ev)
	var ne *notEvidence
	switch {
	case errors.As(err, &ne):
		return nil, refuse(reasonBootPolicy, "the boot of EK %s (class %s) was not judged: %v", ch.ekPin, class, err)
	case err != nil:
		return nil, err
	}
	boot := &judgedBoot{verdict: v, evidence: ev}
	if v.Pass() {
		return boot, nil
	}
	if p, err := s.cfg.BootPolicy.Policy(class); err == nil && !p.Enforced() {
		s.auditAlert(ctx, nodeID, class, v)
		return boot, nil
	}
	summary := failedSummary(v)
	subject := nodeID
	if subject == "" {
		subject = "ek:" + ch.ekPin
	}
	_ = s.cfg.Store.AppendAudit(ctx, store.AuditEvent{Time: s.cfg.Now(), Actor: "bootpolicy", Action: "join.boot_refused", Subject: subject,
		Detail: capDetail(fmt.Sprintf("class %s, %s: %s", class, stage, summary))})
	return nil, refuse(reasonBootPolicy, "the boot fails the %s boot policy (%s) of EK %s: %s", class, stage, ch.ekPin, summary)
}

// capDetail bounds an audit detail.
func capDetail(s string) string {
	const maxDetail = 4096
	if len(s) > maxDetail {
		return s[:maxDetail] + "…"
	}
	return s
}
