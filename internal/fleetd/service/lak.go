package service

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm/tpmpub"
)

// The rules a join's LAK (the AK an intake certified, docs/install.md,
// "Later joins and boot checks quoted by the LAK") is checked by; a
// refusal names one in the server's log and audit.
const (
	// RuleLAKChain: the LAK certificate does not parse, or is not issued
	// by the DevID CA (a node CA certificate chains to the same root).
	RuleLAKChain = "lak-chain"
	// RuleLAKValidity: the LAK certificate is not valid now.
	RuleLAKValidity = "lak-validity"
	// RuleLAKDevice: the LAK certificate names another device than the
	// one the node is declared as (name, serial, product UUID).
	RuleLAKDevice = "lak-device"
	// RuleLAKAK: the LAK certificate certifies another AK than the one
	// that certified the key and quoted the boot.
	RuleLAKAK = "lak-ak"
	// RuleLAKSubstitute: a node installed with a LAK joins, or quotes a
	// boot check, with another AK (or, joining with a token, none).
	RuleLAKSubstitute = "lak-substitute"
)

// maxLAKChain bounds the LAK chain's certificates.
const maxLAKChain = 4

// lakError is a LAK check that failed by rule.
type lakError struct {
	rule string
	err  error
}

func (e *lakError) Error() string { return "rule " + e.rule + ": " + e.err.Error() }

func lakFail(rule, format string, args ...any) *lakError {
	return &lakError{rule: rule, err: fmt.Errorf(format, args...)}
}

// joinLAK decides the LAK a proven tpm join placed at pl keeps in the
// node record. With a LAK chain, the chain must prove the join's AK
// (checkLAK): the AK's name is kept. Without one, a node installed with a
// LAK re-joins only with that AK (its name is kept), and any other node
// keeps none — today's tpm join. A refusal names the rule; it is audited,
// the TPM having proved itself.
func (j *joinService) joinLAK(ctx context.Context, ch *challenge, pl placement) ([]byte, error) {
	if len(ch.ev.LakChain) == 0 {
		if len(pl.lakName) == 0 {
			return nil, nil
		}
		if !bytes.Equal(ch.akName, pl.lakName) {
			return nil, provenRefusal(reasonLAK, pl.nodeID, "rule %s: node %s was installed with LAK %x; the join is by AK %x and carries no LAK certificate",
				RuleLAKSubstitute, pl.nodeID, pl.lakName, ch.akName)
		}
		return pl.lakName, nil
	}
	if err := j.s.checkLAK(ctx, ch.ev.LakChain, ch.ev.AkPublic, ch.akName, pl.nodeID); err != nil {
		var le *lakError
		if errors.As(err, &le) {
			return nil, provenRefusal(reasonLAK, pl.nodeID, "node %s, EK %s: %v", pl.nodeID, ch.ekPin, err)
		}
		return nil, err
	}
	return ch.akName, nil
}

// checkLAK checks that chain's leaf is a LAK certificate of the DevID CA,
// valid now, naming device nodeID as its declaration does (name, serial,
// product UUID), and certifying exactly the AK of akPublic (akName). A
// *lakError names the rule that failed; any other error is the inventory
// source's.
func (s *Server) checkLAK(ctx context.Context, chain [][]byte, akPublic, akName []byte, nodeID string) error {
	iss := s.cfg.Authority.DevIDIssuer
	if iss == nil {
		return lakFail(RuleLAKChain, "fleetd has no DevID CA to check a LAK certificate against (fleetd init --add-devid-ca)")
	}
	if len(chain) > maxLAKChain {
		return lakFail(RuleLAKChain, "the LAK chain has %d certificates, want 1 to %d", len(chain), maxLAKChain)
	}
	leaf, err := x509.ParseCertificate(chain[0])
	if err != nil {
		return lakFail(RuleLAKChain, "the LAK certificate: %v", err)
	}
	now := s.cfg.Now()
	if now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		return lakFail(RuleLAKValidity, "the LAK certificate (serial %s) is valid from %s to %s, not at %s", leaf.SerialNumber,
			leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	roots := x509.NewCertPool()
	roots.AddCert(s.cfg.Authority.Root)
	inter := x509.NewCertPool()
	for _, c := range iss.Chain() {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return lakFail(RuleLAKChain, "the LAK certificate does not chain to the DevID CA: %v", err)
	}
	// The node CA chains to the same root: the leaf must be the DevID
	// CA's own.
	if err := leaf.CheckSignatureFrom(iss.CA()); err != nil {
		return lakFail(RuleLAKChain, "the LAK certificate is not issued by the DevID CA: %v", err)
	}
	info, err := pki.ParseDeviceCert(leaf)
	if err != nil {
		return lakFail(RuleLAKChain, "%v", err)
	}
	if info.Kind != pki.LAK {
		return lakFail(RuleLAKChain, "the certificate is a %s certificate, not a LAK certificate", info.Kind)
	}
	akKey, err := tpmpub.CheckAK(akPublic)
	if err != nil {
		return lakFail(RuleLAKAK, "AK public area: %v", err)
	}
	if !bytes.Equal(info.TPMAKName, akName) || !samePublicKey(akKey, leaf.PublicKey) {
		return lakFail(RuleLAKAK, "the LAK certificate certifies AK %x, the join is by AK %x", info.TPMAKName, akName)
	}
	if info.Device != nodeID {
		return lakFail(RuleLAKDevice, "the LAK certificate names device %.80q, the join is node %s", info.Device, nodeID)
	}
	d, err := s.cfg.Inventory.Get(ctx, nodeID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return lakFail(RuleLAKDevice, "the LAK certificate names device %s, which no declaration names", nodeID)
	case err != nil:
		return fmt.Errorf("look up the declaration of %s: %w", nodeID, err)
	}
	if info.Serial != d.Serial || !strings.EqualFold(info.ProductUUID, d.ProductUUID) {
		return lakFail(RuleLAKDevice, "the LAK certificate names serial %.80q and product UUID %.80q, the declaration of %s serial %q and product UUID %q",
			info.Serial, info.ProductUUID, nodeID, d.Serial, d.ProductUUID)
	}
	return nil
}

// substituteAK reports, for a node n installed with a LAK, a boot quote
// by another AK than the LAK (akName): nil when n has no LAK or akName is
// its LAK.
func substituteAK(n store.Node, akName []byte) error {
	if len(n.LAKName) == 0 || bytes.Equal(n.LAKName, akName) {
		return nil
	}
	return fmt.Errorf("rule %s: the quote is by AK %x, node %s was installed with LAK %x; quote with the LAK: bcd join --attestor tpm again with <data_dir>/devid in place",
		RuleLAKSubstitute, akName, n.ID, n.LAKName)
}

// lakQuote refuses, as not evidence (counted and logged with its rule),
// a boot quote of node n by AK akName (the evidence's AK, which evidenceOf
// found to be the certificate's) when n was installed with another LAK.
func (s *Server) lakQuote(ctx context.Context, n store.Node, akName []byte) error {
	err := substituteAK(n, akName)
	if err == nil {
		return nil
	}
	s.boot.ignore(ignoredNotLAK)
	s.log.WarnContext(ctx, "boot evidence refused: not quoted by the node's LAK", logkey.NodeID, n.ID, "rule", RuleLAKSubstitute, logkey.Reason, err.Error())
	return &notEvidence{reason: ignoredNotLAK, err: err}
}
