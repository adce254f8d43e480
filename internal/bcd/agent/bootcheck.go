package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	mrand "math/rand/v2"
	"os"
	"time"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/internal/logkey"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm"
)

// DefaultBootCheckInterval is how often a node sends boot evidence.
const DefaultBootCheckInterval = time.Hour

// DefaultEventLogPath is where Linux exposes the firmware's event log.
const DefaultEventLogPath = "/sys/kernel/security/tpm0/binary_bios_measurements"

// maxEventLog bounds the event log read (real ones are tens of KiB).
const maxEventLog = 256 << 10

// jittered is d moved by up to a tenth either way, so that a fleet
// started together does not check in together.
func jittered(d time.Duration) time.Duration {
	j := int64(d / 10)
	if j <= 0 {
		return d
	}
	return d - time.Duration(j) + time.Duration(mrand.Int64N(2*j+1))
}

// akName is the AK the current certificate names, or nil.
func (n *node) akName() []byte {
	info, err := pki.ParseNodeCert(n.state().Leaf)
	if err != nil {
		return nil
	}
	return info.TPMAKName
}

// bootChecks reports whether this node gives boot evidence: a TPM is open
// and the certificate names an AK.
func (n *node) bootChecks() bool { return n.c.TPM != nil && len(n.akName()) > 0 }

// readEventLog reads the configured event log; a host without one has
// none.
func (n *node) readEventLog() ([]byte, error) {
	if n.c.NoEventLog {
		return nil, nil
	}
	f, err := os.Open(n.c.EventLogPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the boot event log %s: %w", n.c.EventLogPath, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxEventLog+1))
	if err != nil {
		return nil, fmt.Errorf("read the boot event log %s: %w", n.c.EventLogPath, err)
	}
	if len(b) > maxEventLog {
		return nil, fmt.Errorf("the boot event log %s is over %d bytes", n.c.EventLogPath, maxEventLog)
	}
	return b, nil
}

// evidence quotes PCRs 0-7 with ak over nonce and adds the event log. A
// failure is sent as the evidence's error: the control plane counts it
// and changes nothing.
func (n *node) evidence(ctx context.Context, ak tpm.AttestationKey, nonce []byte) *gatewayv1.BootEvidence {
	ev := &gatewayv1.BootEvidence{Nonce: nonce, AkPublic: ak.PublicArea()}
	quoted, sig, values, err := n.c.TPM.Quote(ctx, ak, nonce, tpm.BootPCRs)
	if err != nil {
		ev.Error = fmt.Sprintf("quote the boot PCRs: %v", err)
		return ev
	}
	log, err := n.readEventLog()
	if err != nil {
		ev.Error = err.Error()
		return ev
	}
	ev.QuoteAttest, ev.QuoteSignature, ev.EventLog = quoted, sig, log
	ev.Pcrs = make(map[uint32][]byte, len(values))
	for i, v := range values {
		ev.Pcrs[uint32(i)] = v
	}
	return ev
}

// bootEvidence answers a boot-check nonce with the AK the certificate
// names.
func (n *node) bootEvidence(ctx context.Context, nonce []byte) *gatewayv1.BootEvidence {
	name := n.akName()
	if n.c.TPM == nil || len(name) == 0 {
		return &gatewayv1.BootEvidence{Nonce: nonce, Error: "this node has no TPM AK"}
	}
	ak, err := n.loadAK(ctx, name)
	if err != nil {
		return &gatewayv1.BootEvidence{Nonce: nonce, Error: err.Error()}
	}
	defer ak.Close()
	return n.evidence(ctx, ak, nonce)
}

// bootResult logs the control plane's verdict on the node's evidence.
func (n *node) bootResult(ctx context.Context, r *gatewayv1.BootCheckResult) {
	switch r.Result {
	case "pass":
		n.log.InfoContext(ctx, "boot check passed")
	case "fail":
		n.log.WarnContext(ctx, "boot check failed the control plane's boot policy", "failed", r.Failed, "action", r.Detail)
	default:
		n.log.InfoContext(ctx, "boot check not evaluated", logkey.Reason, r.Detail)
	}
}
