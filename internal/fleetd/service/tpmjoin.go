package service

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
)

// Limits of the tpm attestor's challenge.
const (
	// MaxChallengeRounds is the most JoinChallenge rounds one tpm join
	// gets; a wrong answer in the last is a refusal.
	MaxChallengeRounds = 3
	// maxOpenChallenges bounds the challenges held in memory, so
	// unauthenticated requests cannot grow it without limit.
	maxOpenChallenges = 65536
	nonceSize         = 32
)

// challenge is one open round of a tpm join, held until its answer.
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
}

// challenges holds open rounds by deferral id. A round is taken out when
// its answer arrives, so an answer cannot be replayed.
type challenges struct {
	mu sync.Mutex
	m  map[string]*challenge
}

func (c *challenges) put(ch *challenge, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]*challenge{}
	}
	if len(c.m) >= maxOpenChallenges {
		for id, old := range c.m {
			if now.After(old.notAfter) {
				delete(c.m, id)
			}
		}
		if len(c.m) >= maxOpenChallenges {
			return false
		}
	}
	c.m[ch.id] = ch
	return true
}

func (c *challenges) take(id string) *challenge {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := c.m[id]
	delete(c.m, id)
	return ch
}

// joinTPM runs the tpm attestor (seed 003, "Attestation and admission"):
// the first request proves nothing yet and gets a challenge bound to its
// EK and AK; the answer proves the AK is in that EK's TPM and quotes the
// boot over a fresh nonce. A known EK reclaims its node without a token;
// an unknown one needs a token as well.
func (j *joinService) joinTPM(ctx context.Context, req *joinv1.JoinRequest, csr *x509.CertificateRequest, csrHash []byte) (*joinv1.JoinResponse, error) {
	if req.DeferralId == "" {
		return j.tpmRound1(ctx, req, csr, csrHash)
	}
	s := j.s
	ch := s.challenges.take(req.DeferralId)
	now := s.cfg.Now()
	switch {
	case ch == nil:
		return nil, refuse(reasonTPMChallenge, "unknown or already answered challenge")
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

	claims := claimsFrom(req.Claims)
	akName := ch.akName
	if ch.known != nil {
		// The same EK reclaims its node, keeping its role and site.
		n := ch.known
		return j.issue(ctx, issuance{
			nodeID: n.ID, reclaim: true, gen: n.Generation + 1, role: n.Role, site: n.Site,
			attestor: "tpm", claims: claims, ekPin: ch.ekPin, akName: akName,
			csr: csr, csrHash: csrHash, daemonVersion: req.DaemonVersion,
		})
	}
	if len(req.SealedToken) == 0 {
		return nil, refuse(reasonTPMEvidence, "EK %s belongs to no node, and the join carries no token", ch.ekPin)
	}
	o, err := j.openToken(ctx, req, csrHash)
	if err != nil {
		return nil, err
	}
	if o.tok.RequireApproval {
		return nil, o.deny(reasonTokenScope, "tokens that require approval are not taken by the tpm attestor")
	}
	nodeID, reclaim, gen, err := j.chooseNode(ctx, o.tok, req.NodeId, claims)
	if err != nil {
		var r *refusal
		if errors.As(err, &r) {
			return nil, o.deny(r.code, "%s", r.reason)
		}
		return nil, err
	}
	return j.issue(ctx, issuance{
		token: o, nodeID: nodeID, reclaim: reclaim, gen: gen, role: o.tok.Role, site: o.tok.Site,
		attestor: "tpm", claims: claims, ekPin: ch.ekPin, akName: akName,
		csr: csr, csrHash: csrHash, daemonVersion: req.DaemonVersion,
	})
}

// tpmRound1 checks the evidence that needs no challenge — the EK, the
// AK's attributes and its certification of the CSR's key — and answers
// with round 1.
func (j *joinService) tpmRound1(ctx context.Context, req *joinv1.JoinRequest, csr *x509.CertificateRequest, csrHash []byte) (*joinv1.JoinResponse, error) {
	s := j.s
	ev := req.Tpm
	if ev == nil {
		return nil, refuse(reasonTPMEvidence, "tpm attestor without TPM evidence")
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
	if known == nil {
		why := "the TPM has no EK certificate"
		if len(ev.EkCertificate) > 0 {
			why = "no manufacturer roots are configured"
			if s.cfg.EKVerifier != nil {
				_, err := s.cfg.EKVerifier.VerifyEKCertificate(ev.EkCertificate, ekPub)
				why = ""
				if err != nil {
					why = err.Error()
				}
			}
		}
		if why != "" {
			return nil, refuse(reasonTPMEvidence, "unknown EK %s: not pinned for any node, and its certificate is not trusted (%s)", ekPin, why)
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
	ch := &challenge{csrHash: csrHash, ev: ev, ekPin: ekPin, akName: akName, known: known}
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
	if !s.challenges.put(&ch, now) {
		return nil, fmt.Errorf("too many open TPM challenges")
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
// nonce and the event log against the quoted PCRs.
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
	if _, err := attest.ReplayEventLog(a.EventLog, pcrs); err != nil {
		return err
	}
	return nil
}

func samePublicKey(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}
