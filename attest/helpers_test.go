package attest_test

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/asn1"
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodetrust/nodetrust/tpm/tpmpub"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// Helpers that build TPM evidence in software, in exactly the formats a TPM
// produces, so that the untagged tests, fuzz seeds and benchmarks can run
// without the simulator. The tpmsim tests check the same paths against a
// real (simulated) TPM's output.

// softKey is an ECDSA P-256 key with a TPMT_PUBLIC of the given attributes,
// signing TPMS_ATTEST structures as a TPM does.
type softKey struct {
	priv       *ecdsa.PrivateKey
	publicArea []byte
}

func newSoftKey(t testing.TB, attrs tpm2.TPMAObject) *softKey {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return &softKey{priv: priv, publicArea: eccPublicArea(t, &priv.PublicKey, attrs)}
}

func newSoftAK(t testing.TB) *softKey { return newSoftKey(t, tpmpub.AKAttributes) }

// eccPublicArea is the TPMT_PUBLIC of an ECDSA P-256 key as package tpm
// derives them, with attrs and the point of pub.
func eccPublicArea(t testing.TB, pub *ecdsa.PublicKey, attrs tpm2.TPMAObject) []byte {
	t.Helper()
	raw, err := pub.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	p := tpmpub.ECCSigningTemplate(attrs, nil)
	p.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
		X: tpm2.TPM2BECCParameter{Buffer: raw[1:33]},
		Y: tpm2.TPM2BECCParameter{Buffer: raw[33:]},
	})
	return tpm2.Marshal(p)
}

func (k *softKey) name(t testing.TB) []byte {
	t.Helper()
	n, err := tpmpub.Name(k.publicArea)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// sign returns the TPMT_SIGNATURE (ECDSA, SHA-256) over attest.
func (k *softKey) sign(t testing.TB, attest []byte) []byte {
	t.Helper()
	d := sha256.Sum256(attest)
	r, s, err := ecdsa.Sign(rand.Reader, k.priv, d[:])
	if err != nil {
		t.Fatal(err)
	}
	return tpm2.Marshal(tpm2.TPMTSignature{
		SigAlg: tpm2.TPMAlgECDSA,
		Signature: tpm2.NewTPMUSignature(tpm2.TPMAlgECDSA, &tpm2.TPMSSignatureECC{
			Hash:       tpm2.TPMAlgSHA256,
			SignatureR: tpm2.TPM2BECCParameter{Buffer: r.FillBytes(make([]byte, 32))},
			SignatureS: tpm2.TPM2BECCParameter{Buffer: s.FillBytes(make([]byte, 32))},
		}),
	})
}

// attestOf marshals a TPMS_ATTEST of typ as the TPM does.
func attestOf(extraData []byte, typ tpm2.TPMST, attested tpm2.TPMUAttest) []byte {
	return tpm2.Marshal(tpm2.TPMSAttest{
		Magic:           tpm2.TPMGeneratedValue,
		Type:            typ,
		QualifiedSigner: tpm2.TPM2BName{Buffer: bytes.Repeat([]byte{0xAA}, 34)},
		ExtraData:       tpm2.TPM2BData{Buffer: extraData},
		ClockInfo:       tpm2.TPMSClockInfo{Clock: 1234, ResetCount: 1, Safe: true},
		FirmwareVersion: 0x2000_0001,
		Attested:        attested,
	})
}

// quoteInfo is the TPMU_ATTEST of a quote of sel with digest.
func quoteInfo(sel tpm2.TPMLPCRSelection, digest []byte) tpm2.TPMUAttest {
	return tpm2.NewTPMUAttest(tpm2.TPMSTAttestQuote, &tpm2.TPMSQuoteInfo{PCRSelect: sel, PCRDigest: tpm2.TPM2BDigest{Buffer: digest}})
}

// bootSelection is the selection tpm.TPM.Quote makes: SHA-256 PCRs 0–7.
func bootSelection() tpm2.TPMLPCRSelection {
	return tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{{
		Hash: tpm2.TPMAlgSHA256, PCRSelect: []byte{0xFF, 0, 0},
	}}}
}

// pcrDigest is SHA-256 over the values of PCRs 0–7 in order.
func pcrDigest(pcrs map[int][]byte) []byte {
	h := sha256.New()
	for i := range 8 {
		h.Write(pcrs[i])
	}
	return h.Sum(nil)
}

// zeroPCRs are PCRs 0–7 of a fresh TPM.
func zeroPCRs() map[int][]byte {
	m := map[int][]byte{}
	for i := range 8 {
		m[i] = make([]byte, 32)
	}
	return m
}

func randomPCRs(t testing.TB) map[int][]byte {
	m := map[int][]byte{}
	for i := range 8 {
		m[i] = randomBytes(t, 32)
	}
	return m
}

// quote makes a TPM2_Quote as k over nonce and pcrs.
func (k *softKey) quote(t testing.TB, nonce []byte, pcrs map[int][]byte) (attest, sig []byte) {
	t.Helper()
	attest = attestOf(nonce, tpm2.TPMSTAttestQuote, quoteInfo(bootSelection(), pcrDigest(pcrs)))
	return attest, k.sign(t, attest)
}

// certify makes a TPM2_Certify as k of the object named name.
func (k *softKey) certify(t testing.TB, name, extraData []byte) (attest, sig []byte) {
	t.Helper()
	attest = attestOf(extraData, tpm2.TPMSTAttestCertify, tpm2.NewTPMUAttest(tpm2.TPMSTAttestCertify, &tpm2.TPMSCertifyInfo{
		Name:          tpm2.TPM2BName{Buffer: name},
		QualifiedName: tpm2.TPM2BName{Buffer: bytes.Repeat([]byte{0xBB}, 34)},
	}))
	return attest, k.sign(t, attest)
}

func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func cloneMap(m map[int][]byte) map[int][]byte {
	c := make(map[int][]byte, len(m))
	for k, v := range m {
		c[k] = bytes.Clone(v)
	}
	return c
}

// softRSAEK returns the TPMT_PUBLIC of an RSA 2048 EK (template L-1) whose
// private key lives here, not in any TPM, and its public key.
func softRSAEK(t testing.TB) ([]byte, *rsa.PublicKey) {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	p := tpm2.RSAEKTemplate
	p.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgRSA, &tpm2.TPM2BPublicKeyRSA{Buffer: k.N.Bytes()})
	return tpm2.Marshal(p), &k.PublicKey
}

// softECCEK returns the TPMT_PUBLIC of an ECC P-256 EK (template L-2) with
// a software key.
func softECCEK(t testing.TB) ([]byte, *ecdsa.PublicKey) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := k.PublicKey.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	p := tpm2.ECCEKTemplate
	p.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{
		X: tpm2.TPM2BECCParameter{Buffer: raw[1:33]},
		Y: tpm2.TPM2BECCParameter{Buffer: raw[33:]},
	})
	return tpm2.Marshal(p), &k.PublicKey
}

// --- EK certificates ---

// oidCommonName is X.520 commonName, which an EK certificate's TPM
// subjectAltName must not carry.
var oidCommonName = asn1.ObjectIdentifier{2, 5, 4, 3}

// --- event logs ---

// Event types (TCG PC Client Platform Firmware Profile, section 10.4.1).
const (
	evNoAction            = 0x00000003
	evSeparator           = 0x00000004
	evSCRTMVersion        = 0x00000008
	evEFIBootServicesApp  = 0x80000003
	evEFIVariableBoot     = 0x80000002
	evEFIVariableDriverCf = 0x80000001
)

type logEvent struct {
	pcr    int
	typ    uint32
	data   []byte
	digest []byte // SHA-256; sha256(data) when nil, zero for EV_NO_ACTION
}

// buildEventLog writes a crypto-agile TCG event log (PC Client Platform
// Firmware Profile, section 10.2) with SHA-256 digests only, as
// tpmtest.EventLog does.
func buildEventLog(events []logEvent) []byte { return tpmLog(events).Bytes() }

func tpmLog(events []logEvent) *tpmtest.EventLog {
	l := &tpmtest.EventLog{}
	for _, e := range events {
		l.Add(tpmtest.Event{PCR: e.pcr, Type: e.typ, Data: e.data, Digest: e.digest})
	}
	return l
}

// digestOf is the SHA-256 digest a logEvent extends its PCR with.
func (e logEvent) digestOf() []byte {
	if e.digest != nil {
		return e.digest
	}
	s := sha256.Sum256(e.data)
	return s[:]
}

// replayLog computes PCRs 0–7 from events, as a TPM extending them would.
func replayLog(events []logEvent) map[int][]byte { return tpmLog(events).PCRs() }

// sampleEvents is a small boot: the CRTM version in PCR 0, a boot
// application in PCR 4, separators in PCRs 0, 4 and 7.
func sampleEvents() []logEvent {
	sep := []byte{0, 0, 0, 0}
	return []logEvent{
		{pcr: 0, typ: evSCRTMVersion, data: []byte("1.0\x00")},
		{pcr: 0, typ: evSeparator, data: sep},
		{pcr: 7, typ: evSeparator, data: sep},
		{pcr: 4, typ: evEFIBootServicesApp, data: []byte("image-load-event"), digest: bytes.Repeat([]byte{0x42}, 32)},
		{pcr: 4, typ: evSeparator, data: sep},
	}
}

// readTestLog reads a real event log from testdata and computes its
// SHA-256 PCR values 0–7 by an independent replay of its SHA-256 digests
// (parsing the crypto-agile format here, not with go-attestation).
func readTestLog(t testing.TB, name string) ([]byte, map[int][]byte) {
	t.Helper()
	log, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return log, replayAgileLog(t, log)
}

func replayAgileLog(t testing.TB, log []byte) map[int][]byte {
	t.Helper()
	le := binary.LittleEndian
	r := log
	take := func(n int) []byte {
		if len(r) < n {
			t.Fatalf("truncated log")
		}
		b := r[:n]
		r = r[n:]
		return b
	}
	// Spec ID event (SHA-1 format).
	take(8)
	take(20)
	spec := take(int(le.Uint32(take(4))))
	n := int(le.Uint32(spec[24:28]))
	sizes := map[uint16]int{}
	for i := range n {
		off := 28 + 4*i
		sizes[le.Uint16(spec[off:])] = int(le.Uint16(spec[off+2:]))
	}
	pcrs := zeroPCRs()
	for len(r) > 0 {
		idx := int(le.Uint32(take(4)))
		typ := le.Uint32(take(4))
		count := int(le.Uint32(take(4)))
		var d256 []byte
		for range count {
			alg := le.Uint16(take(2))
			d := take(sizes[alg])
			if alg == uint16(tpm2.TPMAlgSHA256) {
				d256 = d
			}
		}
		take(int(le.Uint32(take(4))))
		if typ == evNoAction || idx > 7 {
			continue
		}
		if d256 == nil {
			t.Fatalf("event without a SHA-256 digest")
		}
		h := sha256.New()
		h.Write(pcrs[idx])
		h.Write(d256)
		pcrs[idx] = h.Sum(nil)
	}
	return pcrs
}

// timeZero lets newVerifier use the default clock.
var timeZero time.Time
