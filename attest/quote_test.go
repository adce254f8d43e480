package attest_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/tpm/tpmpub"
)

func TestVerifyQuoteAccepts(t *testing.T) {
	ak := newSoftAK(t)
	nonce := randomBytes(t, 32)
	for name, pcrs := range map[string]map[int][]byte{"fresh PCRs": zeroPCRs(), "measured PCRs": randomPCRs(t)} {
		t.Run(name, func(t *testing.T) {
			q, sig := ak.quote(t, nonce, pcrs)
			if err := attest.VerifyQuote(ak.publicArea, q, sig, nonce, pcrs); err != nil {
				t.Fatal(err)
			}
		})
	}
	t.Run("a 4-byte PCR bitmap", func(t *testing.T) {
		pcrs := randomPCRs(t)
		sel := tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{{Hash: tpm2.TPMAlgSHA256, PCRSelect: []byte{0xFF, 0, 0, 0}}}}
		q := attestOf(nonce, tpm2.TPMSTAttestQuote, quoteInfo(sel, pcrDigest(pcrs)))
		if err := attest.VerifyQuote(ak.publicArea, q, ak.sign(t, q), nonce, pcrs); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("an AK with other usage attributes", func(t *testing.T) {
		// Who may use the AK in its TPM is not the verifier's concern.
		attrs := tpmpub.AKAttributes
		attrs.UserWithAuth, attrs.NoDA, attrs.AdminWithPolicy = false, false, true
		ak := newSoftKey(t, attrs)
		pcrs := randomPCRs(t)
		q, sig := ak.quote(t, nonce, pcrs)
		if err := attest.VerifyQuote(ak.publicArea, q, sig, nonce, pcrs); err != nil {
			t.Fatal(err)
		}
	})
}

func TestVerifyQuoteRefuses(t *testing.T) {
	ak := newSoftAK(t)
	other := newSoftAK(t)
	nonce := randomBytes(t, 32)
	pcrs := randomPCRs(t)
	q, sig := ak.quote(t, nonce, pcrs)

	signed := func(extra []byte, typ tpm2.TPMST, u tpm2.TPMUAttest) ([]byte, []byte) {
		a := attestOf(extra, typ, u)
		return a, ak.sign(t, a)
	}
	withPCRs := func(f func(m map[int][]byte)) map[int][]byte {
		m := cloneMap(pcrs)
		f(m)
		return m
	}
	sel := func(s ...tpm2.TPMSPCRSelection) tpm2.TPMLPCRSelection {
		return tpm2.TPMLPCRSelection{PCRSelections: s}
	}
	sha256Bank := func(bitmap ...byte) tpm2.TPMSPCRSelection {
		return tpm2.TPMSPCRSelection{Hash: tpm2.TPMAlgSHA256, PCRSelect: bitmap}
	}
	type input struct{ ak, attest, sig, nonce []byte }
	type tcase struct {
		name   string
		in     input
		pcrs   map[int][]byte
		substr string
		isAK   bool
	}
	good := input{ak.publicArea, q, sig, nonce}
	with := func(f func(in *input)) input {
		in := good
		f(&in)
		return in
	}
	var cases []tcase
	add := func(name string, in input, p map[int][]byte, substr string) {
		if p == nil {
			p = pcrs
		}
		cases = append(cases, tcase{name: name, in: in, pcrs: p, substr: substr})
	}

	add("another nonce", with(func(in *input) { in.nonce = randomBytes(t, 32) }), nil, "nonce")
	add("a nonce one byte longer", with(func(in *input) { in.nonce = append(bytes.Clone(nonce), 0) }), nil, "nonce")
	add("no nonce", with(func(in *input) { in.nonce = nil }), nil, "nonce of 0 bytes")
	{
		short := randomBytes(t, 8)
		a, s := ak.quote(t, short, pcrs)
		add("a nonce shorter than MinNonceSize", input{ak.publicArea, a, s, short}, nil, "at least")
	}
	add("a tampered PCR value", good, withPCRs(func(m map[int][]byte) { m[3][0] ^= 1 }), "pcrDigest")
	add("PCR values swapped", good, withPCRs(func(m map[int][]byte) { m[1], m[2] = m[2], m[1] }), "pcrDigest")
	add("a missing PCR", good, withPCRs(func(m map[int][]byte) { delete(m, 7) }), "7 PCR values")
	add("an extra PCR", good, withPCRs(func(m map[int][]byte) { m[8] = make([]byte, 32) }), "9 PCR values")
	add("PCR 8 instead of 7", good, withPCRs(func(m map[int][]byte) { m[8] = m[7]; delete(m, 7) }), "no value for PCR 7")
	add("a short PCR value", good, withPCRs(func(m map[int][]byte) { m[5] = m[5][:20] }), "PCR 5 value of 20 bytes")
	add("a signature by another AK", with(func(in *input) { in.sig = other.sign(t, q) }), nil, "not the AK's")
	{
		a, s := other.quote(t, nonce, pcrs)
		add("another AK's quote", input{ak.publicArea, a, s, nonce}, nil, "not the AK's")
		add("another AK's quote, checked with that AK's public area but the first AK's signature", input{other.publicArea, a, sig, nonce}, nil, "not the AK's")
	}
	add("a tampered attestation", with(func(in *input) { in.attest = bytes.Clone(q); in.attest[len(q)-1] ^= 1 }), nil, "not the AK's")
	add("a tampered signature", with(func(in *input) { in.sig = bytes.Clone(sig); in.sig[len(sig)-1] ^= 1 }), nil, "not the AK's")
	add("a signature with trailing bytes", with(func(in *input) { in.sig = append(bytes.Clone(sig), 0) }), nil, "trailing")
	add("an empty signature", with(func(in *input) { in.sig = nil }), nil, "empty TPMT_SIGNATURE")
	add("a truncated signature", with(func(in *input) { in.sig = sig[:10] }), nil, "malformed TPMT_SIGNATURE")
	add("an empty attestation", with(func(in *input) { in.attest = nil }), nil, "TPMS_ATTEST of 0 bytes")
	{
		d := sha256.Sum256(q)
		_ = d
		rsaSig := tpm2.Marshal(tpm2.TPMTSignature{SigAlg: tpm2.TPMAlgRSASSA, Signature: tpm2.NewTPMUSignature(tpm2.TPMAlgRSASSA,
			&tpm2.TPMSSignatureRSA{Hash: tpm2.TPMAlgSHA256, Sig: tpm2.TPM2BPublicKeyRSA{Buffer: make([]byte, 256)}})})
		add("an RSA signature", with(func(in *input) { in.sig = rsaSig }), nil, "signature algorithm")
		s, err := tpm2.Unmarshal[tpm2.TPMTSignature](sig)
		if err != nil {
			t.Fatal(err)
		}
		e, _ := s.Signature.ECDSA()
		e.Hash = tpm2.TPMAlgSHA384
		add("an ECDSA signature claiming SHA-384", with(func(in *input) { in.sig = tpm2.Marshal(s) }), nil, "signature hash")
		nullSig := tpm2.Marshal(tpm2.TPMTSignature{SigAlg: tpm2.TPMAlgNull})
		add("a NULL signature", with(func(in *input) { in.sig = nullSig }), nil, "signature")
	}
	{
		a, s := signed(nonce, tpm2.TPMSTAttestCertify, tpm2.NewTPMUAttest(tpm2.TPMSTAttestCertify, &tpm2.TPMSCertifyInfo{Name: tpm2.TPM2BName{Buffer: ak.name(t)}}))
		add("a certification signed by the AK", input{ak.publicArea, a, s, nonce}, nil, "type")
	}
	{
		a := append(attestOf(nonce, tpm2.TPMSTAttestQuote, quoteInfo(bootSelection(), pcrDigest(pcrs))), 0)
		add("a quote with trailing bytes, signed", input{ak.publicArea, a, ak.sign(t, a), nonce}, nil, "trailing")
	}
	{
		a := attestOf(nonce, tpm2.TPMSTAttestQuote, quoteInfo(bootSelection(), pcrDigest(pcrs)))
		a[0] ^= 0x01 // TPM_GENERATED_VALUE is the first field
		add("a structure without TPM_GENERATED_VALUE, signed", input{ak.publicArea, a, ak.sign(t, a), nonce}, nil, "TPMS_ATTEST")
	}
	for _, s := range []struct {
		name string
		sel  tpm2.TPMLPCRSelection
	}{
		{"the SHA-1 bank", sel(tpm2.TPMSPCRSelection{Hash: tpm2.TPMAlgSHA1, PCRSelect: []byte{0xFF, 0, 0}})},
		{"PCRs 0-6", sel(sha256Bank(0x7F, 0, 0))},
		{"PCRs 0-8", sel(sha256Bank(0xFF, 0x01, 0))},
		{"PCRs 0-7 and 23", sel(sha256Bank(0xFF, 0, 0x80))},
		{"an empty bitmap", sel(sha256Bank())},
		{"a 5-byte bitmap", sel(sha256Bank(0xFF, 0, 0, 0, 0))},
		{"two banks", sel(sha256Bank(0xFF, 0, 0), tpm2.TPMSPCRSelection{Hash: tpm2.TPMAlgSHA1, PCRSelect: []byte{0xFF, 0, 0}})},
		{"no bank", sel()},
	} {
		a, sg := signed(nonce, tpm2.TPMSTAttestQuote, quoteInfo(s.sel, pcrDigest(pcrs)))
		add("a quote of "+s.name, input{ak.publicArea, a, sg, nonce}, nil, "select")
	}
	for _, tc := range []struct {
		name  string
		attrs func(a *tpm2.TPMAObject)
	}{
		{"an unrestricted AK (a node key)", func(a *tpm2.TPMAObject) { a.Restricted = false }},
		{"an AK that can decrypt", func(a *tpm2.TPMAObject) { a.Decrypt = true }},
		{"an AK that can leave the TPM", func(a *tpm2.TPMAObject) { a.FixedTPM = false }},
		{"an AK that can be duplicated", func(a *tpm2.TPMAObject) { a.FixedParent = false }},
		{"an imported AK", func(a *tpm2.TPMAObject) { a.SensitiveDataOrigin = false }},
	} {
		attrs := tpmpub.AKAttributes
		tc.attrs(&attrs)
		k := newSoftKey(t, attrs)
		a, s := k.quote(t, nonce, pcrs)
		cases = append(cases, tcase{name: tc.name, in: input{k.publicArea, a, s, nonce}, pcrs: pcrs, substr: "AK public area", isAK: true})
	}
	cases = append(cases,
		tcase{name: "an empty AK public area", in: with(func(in *input) { in.ak = nil }), pcrs: pcrs, substr: "empty", isAK: true},
		tcase{name: "an RSA EK as AK", in: with(func(in *input) { in.ak, _ = softRSAEK(t) }), pcrs: pcrs, substr: "type", isAK: true},
	)

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := attest.VerifyQuote(tc.in.ak, tc.in.attest, tc.in.sig, tc.in.nonce, tc.pcrs)
			if err == nil {
				t.Fatal("accepted")
			}
			t.Log(err)
			if !errors.Is(err, attest.ErrQuote) {
				t.Fatalf("error %v does not wrap ErrQuote", err)
			}
			if errors.Is(err, attest.ErrAK) != tc.isAK {
				t.Fatalf("error %v: errors.Is(err, ErrAK) = %v, want %v", err, !tc.isAK, tc.isAK)
			}
			if !strings.Contains(err.Error(), tc.substr) {
				t.Fatalf("error %q does not mention %q", err, tc.substr)
			}
		})
	}
}

func TestAKName(t *testing.T) {
	ak := newSoftAK(t)
	name, err := attest.AKName(ak.publicArea)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(ak.publicArea)
	if want := append([]byte{0x00, 0x0B}, h[:]...); !bytes.Equal(name, want) {
		t.Fatalf("AKName = %x, want %x", name, want)
	}
	s, err := attest.AKNameHex(ak.publicArea)
	if err != nil {
		t.Fatal(err)
	}
	if s != hex.EncodeToString(name) || strings.ToLower(s) != s || !strings.HasPrefix(s, "000b") {
		t.Fatalf("AKNameHex = %q", s)
	}

	node := newSoftKey(t, tpmpub.NodeKeyAttributes)
	for name, area := range map[string][]byte{
		"a node key":    node.publicArea,
		"nothing":       nil,
		"garbage":       []byte("garbage"),
		"trailing data": append(bytes.Clone(ak.publicArea), 0),
	} {
		if _, err := attest.AKName(area); !errors.Is(err, attest.ErrAK) {
			t.Errorf("AKName of %s: %v, want ErrAK", name, err)
		}
		if _, err := attest.AKNameHex(area); !errors.Is(err, attest.ErrAK) {
			t.Errorf("AKNameHex of %s: %v, want ErrAK", name, err)
		}
	}
}
