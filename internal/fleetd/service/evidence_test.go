package service

import (
	"testing"

	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
)

// The store keeps the event log of any verdict's evidence: its bound is
// the largest log a verdict is made of.
func TestKeptEvidenceBoundIsTheEventLogLimit(t *testing.T) {
	if store.MaxEvidenceLogSize != attest.MaxEventLogSize {
		t.Errorf("store.MaxEvidenceLogSize %d, attest.MaxEventLogSize %d", store.MaxEvidenceLogSize, attest.MaxEventLogSize)
	}
	if store.MaxEvidencePCRs != maxPCRIndex+1 {
		t.Errorf("store.MaxEvidencePCRs %d, want %d (PCRs 0 to %d)", store.MaxEvidencePCRs, maxPCRIndex+1, maxPCRIndex)
	}
}
