package callsig

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzUnmarshalEnvelope: decoding never panics; what decodes marshals back
// to the same bytes; what does not decode is ErrMalformed.
func FuzzUnmarshalEnvelope(f *testing.F) {
	s := newTestSigner(f, testInst, testKey("inst"), newClock(testNow).Now)
	signed := mustMarshal(f, mustSign(f, s, "payload"))
	unsigned := mustSign(f, s, "")
	unsigned.Signature = nil
	f.Add(signed)
	f.Add(mustMarshal(f, unsigned))
	f.Add(signed[:len(signed)-1])
	f.Add(append(bytes.Clone(signed), 0))
	f.Add([]byte{})
	f.Add([]byte{EnvelopeVersion, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		var e Envelope
		if err := e.UnmarshalBinary(data); err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		again, err := e.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded envelope does not marshal: %v", err)
		}
		if !bytes.Equal(again, data) {
			t.Fatalf("re-marshalled\n%x\nwant\n%x", again, data)
		}
	})
}

// FuzzUnmarshalMachineProof: decoding never panics; what decodes marshals
// back to the same bytes; what does not decode is ErrMalformed. (Verifying
// changed proofs is TestVerifyMachineProofRefusesEveryFlippedByte: with
// certificate checks in the loop the fuzzer runs some 100 times slower.)
func FuzzUnmarshalMachineProof(f *testing.F) {
	fl := newTestFleet(f, testTD)
	p := newTestMachine(f, fl.auth.Issuer, testNode, testNS).proof(f, testInst, instPub())
	valid, err := p.MarshalBinary()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid)
	f.Add(valid[:len(valid)/2])
	f.Add([]byte{MachineProofVersion, 0, 0, 0, 1, 0, 0, 0, 1, 0x30})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var q MachineProof
		if err := q.UnmarshalBinary(data); err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		again, err := q.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded proof does not marshal: %v", err)
		}
		if !bytes.Equal(again, data) {
			t.Fatalf("re-marshalled\n%x\nwant\n%x", again, data)
		}
	})
}

// Flipping any one bit of a valid proof's encoding gives bytes that do not
// decode, or a proof that is refused, or (a flip in a part no check reads,
// such as a certificate's unsigned outer bytes that x509 ignores) one that
// proves the same peer. Nothing panics and no flip proves someone else.
func TestVerifyMachineProofRefusesEveryFlippedByte(t *testing.T) {
	fl := newTestFleet(t, testTD)
	p := newTestMachine(t, fl.auth.Issuer, testNode, testNS).proof(t, testInst, instPub())
	valid, err := p.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	accepted := 0
	for i := 1; i < len(valid); i++ {
		data := bytes.Clone(valid)
		data[i] ^= 0x01
		var q MachineProof
		if q.UnmarshalBinary(data) != nil {
			continue
		}
		peer, err := VerifyMachineProof(&q, fl.trust, testNS, testNow)
		if err != nil {
			wantRejection(t, err, CheckMachineProof, "")
			continue
		}
		accepted++
		if peer.NodeID != testNode || peer.BootID != testBoot || peer.Sender != testInst || !peer.SenderKey.Equal(instPub()) {
			t.Fatalf("flipping byte %d proves %+v", i, peer)
		}
	}
	if accepted > 0 {
		t.Logf("%d flips still verify as the same peer", accepted)
	}
}
