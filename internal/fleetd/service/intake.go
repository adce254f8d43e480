package service

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/joinresponse"
	"github.com/nodetrust/nodetrust/tpm/tpmpub"
)

// IntakeRefused starts the message of every refused intake on the wire;
// the reason is logged and audited on the server only.
const IntakeRefused = "Intake refused"

// intakeHint is what a refused intake's caller is told to do.
const intakeHint = "the machine must be declared with its EK bound by a declarer (fleetd inventory apply), planned or provisioning, " +
	"and booted into the install environment its boot policy accepts; run bcd intake again, and see fleetd's log for request %s"

// DefaultIntakeWindow is how long an intake's certificates and session
// last when Config.IntakeWindow is not set: long enough for an
// installation, short enough that a stolen session soon ends.
const DefaultIntakeWindow = 2 * time.Hour

// purposeIntake marks the challenge rounds of an intake.
const purposeIntake = "intake"

// maxIntakeSessions bounds the intake sessions held in the store.
const maxIntakeSessions = 65536

// intakeBackdate is how far before now an intake's certificates start, to
// absorb the node's clock skew.
const intakeBackdate = 5 * time.Minute

// ErrIntakeSessionEnded is a lookup of an intake session that has ended:
// a later step refuses it.
var ErrIntakeSessionEnded = errors.New("the intake session has ended")

// Intake runs an intake's two rounds (seed 003, "Attestation and
// admission"). A refusal is PERMISSION_DENIED "Intake refused: <what to
// do>"; its reason is logged (and audited once the TPM proved itself).
func (j *joinService) Intake(ctx context.Context, req *joinv1.IntakeRequest) (*joinv1.IntakeResponse, error) {
	reqID := newRequestID()
	resp, err := j.intake(ctx, req)
	if err == nil {
		outcome := "issued"
		if resp.GetChallenge() != nil {
			outcome = "challenge"
		}
		j.s.metrics.intakes.WithLabelValues(outcome).Inc()
		return resp, nil
	}
	var r *refusal
	if !errors.As(err, &r) {
		j.s.metrics.intakes.WithLabelValues("failed").Inc()
		if errors.Is(err, pki.ErrKeyUnavailable) {
			return nil, signFailure("intake (request "+reqID+")", err, logkey.RequestID, reqID)
		}
		return nil, unavailable("intake", "intake could not be completed; retry later (request "+reqID+")", err, logkey.RequestID, reqID)
	}
	j.s.refusedIntake(ctx, req, r, reqID)
	return nil, refused(codes.PermissionDenied, "%s: "+intakeHint, IntakeRefused, reqID)
}

// refusedIntake counts a refused intake by its reason, logs it within the
// refusal log's bound, and audits it when the TPM had proved itself
// (r.audit).
func (s *Server) refusedIntake(ctx context.Context, req *joinv1.IntakeRequest, r *refusal, reqID string) {
	s.metrics.intakes.WithLabelValues("refused_" + r.code.String()).Inc()
	s.logRefusal(ctx, r.code.String(), peerSource(ctx), "intake refused", logkey.RequestID, reqID, logkey.Reason, r.reason,
		"reason_code", r.code.String(), logkey.ClaimedHostname, capClaim(req.GetClaims().GetHostname()), logkey.Peer, peerAddr(ctx))
	if !r.audit {
		return
	}
	if ok, _ := s.auditThrottle.Allow("intake."+r.code.String(), r.tokenID); !ok {
		s.metrics.auditDropped.Inc()
		return
	}
	_ = s.cfg.Store.AppendAudit(ctx, store.AuditEvent{Time: s.cfg.Now(), Actor: "intake", Action: "intake.refused",
		Subject: r.tokenID, Detail: capDetail(r.code.String() + ": " + r.reason)})
}

// provenRefusal is a refusal of an intake whose TPM proved itself: it is
// audited, with subject (the EK or the device) in place of a token id.
func provenRefusal(code refusalCode, subject, format string, args ...any) *refusal {
	r := refuse(code, format, args...)
	r.audit, r.tokenID = true, subject
	return r
}

func (j *joinService) intake(ctx context.Context, req *joinv1.IntakeRequest) (*joinv1.IntakeResponse, error) {
	if len(req.Csr) == 0 || len(req.Csr) > maxCSRBytes {
		return nil, refuse(reasonCSR, "CSR missing or larger than %d bytes", maxCSRBytes)
	}
	csr, err := pki.ParseCSR(req.Csr)
	if err != nil {
		return nil, refuse(reasonCSR, "bad CSR: %v", err)
	}
	sum := sha256.Sum256(req.Csr)
	csrHash := sum[:]
	if req.DeferralId == "" {
		return j.intakeRound1(ctx, req, csr, csrHash)
	}
	s := j.s
	ch, err := s.takeChallenge(ctx, req.DeferralId)
	if err != nil {
		return nil, err
	}
	now := s.cfg.Now()
	switch {
	case ch == nil:
		return nil, refuse(reasonTPMChallenge, "unknown or already answered intake round")
	case ch.purpose != purposeIntake:
		return nil, refuse(reasonTPMChallenge, "the deferral is a round of a join, not of an intake")
	case !now.Before(ch.notAfter):
		return nil, refuse(reasonTPMChallenge, "intake round %d expired at %s", ch.round, ch.notAfter.UTC().Format(time.RFC3339))
	case string(ch.csrHash) != string(csrHash):
		return nil, refuse(reasonTPMChallenge, "the answer is for another CSR than the intake round's")
	case req.Answer == nil || req.Answer.Round != ch.round:
		return nil, refuse(reasonTPMChallenge, "no answer to intake round %d", ch.round)
	}
	if err := j.checkAnswer(ch, req.Answer); err != nil {
		if ch.round >= MaxChallengeRounds {
			return nil, refuse(reasonTPMChallenge, "intake round %d failed, the last: %v", ch.round, err)
		}
		s.log.WarnContext(ctx, "intake round failed, asking again", "round", ch.round, logkey.EKPin, ch.ekPin, logkey.Reason, err.Error())
		return intakeChallenge(j.newRound(ctx, ch, ch.round+1))
	}
	return j.intakeProven(ctx, req, ch)
}

// intakeRound1 checks the evidence that needs no challenge — the EK is
// trusted by its certificate or bound by a declaration, and the AK
// certified the CSR's key, a TPM-held device key (fixedTPM, fixedParent,
// sign-only) — and answers with round 1.
func (j *joinService) intakeRound1(ctx context.Context, req *joinv1.IntakeRequest, csr *x509.CertificateRequest, csrHash []byte) (*joinv1.IntakeResponse, error) {
	s := j.s
	ev := req.Tpm
	if ev == nil {
		return nil, refuse(reasonTPMEvidence, "intake without TPM evidence")
	}
	ekPub, err := attest.EKPublic(ev.EkPublic)
	if err != nil {
		return nil, refuse(reasonTPMEvidence, "EK public area: %v", err)
	}
	ekPin, err := attest.EKPin(ekPub)
	if err != nil {
		return nil, refuse(reasonTPMEvidence, "EK: %v", err)
	}
	why := "the TPM has no EK certificate"
	if len(ev.EkCertificate) > 0 {
		why = "no manufacturer roots are configured"
		if s.cfg.EKVerifier != nil {
			why = ""
			if _, err := s.cfg.EKVerifier.VerifyEKCertificateChain(ev.EkCertificate, ev.EkChain, ekPub); err != nil {
				why = err.Error()
			}
		}
	}
	if why != "" {
		// An EK a declaration binds needs no certificate; whether the
		// binding is honoured is decided once the TPM proved it.
		bound, err := s.cfg.Inventory.ByEKPin(ctx, ekPin)
		if err != nil {
			return nil, fmt.Errorf("look up the declarations binding EK %s: %w", ekPin, err)
		}
		if len(bound) == 0 {
			return nil, refuse(reasonTPMEvidence, "EK %s: its certificate is not trusted (%s), and no declaration binds it", ekPin, why)
		}
	}
	keyPub, err := attest.VerifyCertify(ev.AkPublic, ev.CertifyAttest, ev.CertifySignature, ev.NodeKeyPublic, csrHash)
	if err != nil {
		return nil, refuse(reasonTPMEvidence, "the AK's certification of the device key (it must be a TPM key: fixedTPM, fixedParent, sign-only): %v", err)
	}
	if !samePublicKey(keyPub, csr.PublicKey) {
		return nil, refuse(reasonTPMEvidence, "the AK certified another key than the CSR's")
	}
	akName, err := attest.AKName(ev.AkPublic)
	if err != nil {
		return nil, refuse(reasonTPMEvidence, "AK: %v", err)
	}
	ch := &challenge{csrHash: csrHash, ev: ev, ekPin: ekPin, akName: akName, purpose: purposeIntake}
	return intakeChallenge(j.newRound(ctx, ch, 1))
}

// intakeChallenge carries a challenge round newRound made in an
// IntakeResponse.
func intakeChallenge(resp *joinv1.JoinResponse, err error) (*joinv1.IntakeResponse, error) {
	if err != nil {
		return nil, err
	}
	return &joinv1.IntakeResponse{Result: &joinv1.IntakeResponse_Challenge{Challenge: resp.GetChallenge()}}, nil
}

// intakeProven decides an intake whose TPM answered its challenge: the
// declared device it is (lifecycle.Admission.DecideIntake), the boot
// judged by the install environment class's policy, then the LDevID and
// LAK certificates and the stored session.
func (j *joinService) intakeProven(ctx context.Context, req *joinv1.IntakeRequest, ch *challenge) (*joinv1.IntakeResponse, error) {
	s := j.s
	subject := "ek:" + ch.ekPin
	decl, why, err := s.admission.DecideIntake(ctx, ch.ekPin, claimsFrom(req.Claims))
	var rf *lifecycle.Refusal
	switch {
	case errors.As(err, &rf):
		if rf.Declared != "" {
			subject = rf.Declared
		}
		return nil, provenRefusal(reasonNotAdmitted, subject, "EK %s: %s", ch.ekPin, rf.Reason)
	case err != nil:
		return nil, err
	}
	bootVerdict := store.IntakeBootNone
	if s.cfg.BootPolicy != nil {
		if bootVerdict, err = j.intakeBootCheck(ctx, ch, decl.Name, req.Answer); err != nil {
			return nil, err
		}
	}
	devKey, err := tpmpub.CheckNodeKey(ch.ev.NodeKeyPublic)
	if err != nil {
		return nil, provenRefusal(reasonTPMEvidence, decl.Name, "device key public area: %v", err)
	}
	akKey, err := tpmpub.CheckAK(ch.ev.AkPublic)
	if err != nil {
		return nil, provenRefusal(reasonTPMEvidence, decl.Name, "AK public area: %v", err)
	}
	iss := s.cfg.Authority.DevIDIssuer
	if iss == nil {
		return nil, errors.New("the PKI has no DevID CA: fleetd init --add-devid-ca")
	}
	now := s.cfg.Now()
	notAfter := now.Add(s.cfg.IntakeWindow)
	dr := pki.DeviceRequest{Device: decl.Name, Serial: decl.Serial, ProductUUID: decl.ProductUUID,
		TPMAKName: ch.akName, NotBefore: now.Add(-intakeBackdate), NotAfter: notAfter}
	ldevReq, lakReq := dr, dr
	ldevReq.Kind, ldevReq.PublicKey = pki.LDevID, devKey
	lakReq.Kind, lakReq.PublicKey = pki.LAK, akKey
	ldevid, err := iss.IssueDevice(ldevReq)
	if err != nil {
		return nil, fmt.Errorf("issue the LDevID of %s: %w", decl.Name, err)
	}
	lak, err := iss.IssueDevice(lakReq)
	if err != nil {
		return nil, fmt.Errorf("issue the LAK certificate of %s: %w", decl.Name, err)
	}
	sess := store.IntakeSession{
		ID: randomHex(16), Device: decl.Name, EKPin: ch.ekPin, EKPublic: ch.ev.EkPublic,
		AKName: ch.akName, AKPublic: ch.ev.AkPublic,
		LDevIDSerial: ldevid.SerialNumber.String(), LAKSerial: lak.SerialNumber.String(),
		CreatedAt: now, ExpiresAt: notAfter, BootVerdict: bootVerdict,
	}
	if err := s.cfg.Store.PutIntakeSession(ctx, sess, now, maxIntakeSessions); err != nil {
		return nil, fmt.Errorf("store the intake session of %s: %w", decl.Name, err)
	}
	detail := fmt.Sprintf("EK %s, AK %s, binding %s; LDevID serial %s, LAK serial %s; session %s until %s",
		ch.ekPin, hex.EncodeToString(ch.akName), why, sess.LDevIDSerial, sess.LAKSerial, sess.ID, notAfter.UTC().Format(time.RFC3339))
	if err := s.cfg.Store.AppendAudit(ctx, store.AuditEvent{Time: now, Actor: "intake", Action: "intake", Subject: decl.Name, Detail: capDetail(detail)}); err != nil {
		return nil, fmt.Errorf("audit the intake of %s: %w", decl.Name, err)
	}
	s.log.InfoContext(ctx, "intake", logkey.NodeID, decl.Name, logkey.EKPin, ch.ekPin, "session", sess.ID,
		"ldevid_serial", sess.LDevIDSerial, "lak_serial", sess.LAKSerial, logkey.Peer, peerAddr(ctx))
	chainDER := func(leaf *x509.Certificate) [][]byte {
		out := [][]byte{leaf.Raw}
		for _, c := range iss.Chain() {
			out = append(out, c.Raw)
		}
		return out
	}
	signed, err := joinresponse.SignIntake(s.cfg.Authority.JoinSigner, &joinv1.IntakeResult{
		CsrSha256:               ch.csrHash,
		LdevidChain:             chainDER(ldevid),
		LakChain:                chainDER(lak),
		Roots:                   [][]byte{s.cfg.Authority.Root.Raw},
		Device:                  decl.Name,
		SessionId:               sess.ID,
		SessionNotAfterUnixNano: notAfter.UnixNano(),
	})
	if err != nil {
		return nil, fmt.Errorf("sign the intake result of %s: %w", decl.Name, err)
	}
	return &joinv1.IntakeResponse{Result: &joinv1.IntakeResponse_Issued{Issued: signed}}, nil
}

// intakeBootCheck judges the quoted boot by the policy of the intake
// class (Config.IntakeClass) at the intake stage and stores the verdict
// under the device's name. A failed verdict of an enforced policy refuses
// the intake; of a policy that only alerts, it is audited as an alert.
// The verdict (store.IntakeBootPass or IntakeBootFail) is kept with the
// session: it is the boot this session proved, and the only one a later
// pass marker may stand for.
func (j *joinService) intakeBootCheck(ctx context.Context, ch *challenge, device string, a *joinv1.ChallengeAnswer) (string, error) {
	s := j.s
	class := s.cfg.IntakeClass
	pcrs := make(map[int][]byte, len(a.Pcrs))
	for i, v := range a.Pcrs {
		pcrs[int(i)] = v
	}
	ev := bootpolicy.Evidence{
		Quote:    &bootpolicy.Quote{AKPublic: ch.ev.AkPublic, Attest: a.QuoteAttest, Signature: a.QuoteSignature, Nonce: ch.nonce},
		PCRs:     pcrs,
		EventLog: a.EventLog,
	}
	v, err := s.judgeBoot(ctx, device, class, bootpolicy.Intake, ev)
	var ne *notEvidence
	switch {
	case errors.As(err, &ne):
		return "", provenRefusal(reasonBootPolicy, device, "the install environment's boot of %s (class %s) was not judged: %v", device, class, err)
	case err != nil:
		return "", err
	case v.Pass():
		return store.IntakeBootPass, nil
	}
	if p, err := s.cfg.BootPolicy.Policy(class); err == nil && !p.Enforced() {
		s.auditAlert(ctx, device, class, v)
		return store.IntakeBootFail, nil
	}
	return "", provenRefusal(reasonBootPolicy, device, "the boot of %s fails the %s boot policy at intake: %s", device, class, failedSummary(v))
}

// IntakeSession returns the intake session id for a step that follows
// intake (admission): an error wrapping store.ErrNotFound when there is
// none, and one wrapping ErrIntakeSessionEnded when it has ended at the
// server's clock — a stale session is refused, never used.
func (s *Server) IntakeSession(ctx context.Context, id string) (store.IntakeSession, error) {
	sess, err := s.cfg.Store.GetIntakeSession(ctx, id)
	if err != nil {
		return store.IntakeSession{}, fmt.Errorf("intake session %s: %w", capClaim(id), err)
	}
	if now := s.cfg.Now(); !now.Before(sess.ExpiresAt) {
		return store.IntakeSession{}, fmt.Errorf("intake session %s of %s ended at %s (now %s): %w; run bcd intake again",
			sess.ID, sess.Device, sess.ExpiresAt.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), ErrIntakeSessionEnded)
	}
	return sess, nil
}
