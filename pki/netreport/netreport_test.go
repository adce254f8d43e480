package netreport

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/pki"
)

func testReport() Report {
	return Report{
		Neighbor: Neighbor{Interface: "eth0", ChassisName: "sw-01", ChassisIDType: "mac", ChassisID: "6a:d7:ab:dc:5d:e9",
			PortIDType: "ifname", PortID: "ge-0/0/1", PortDescr: "uplink to node-01"},
		ObservedAt: time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC),
	}
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestSignVerifyRoundTrip(t *testing.T) {
	k := newKey(t)
	s, err := Sign(testReport(), k)
	if err != nil {
		t.Fatal(err)
	}
	pin, _ := pki.PinOf(&k.PublicKey)
	if s.KeyID != pin.String() {
		t.Fatalf("kid %s, want the device key's pin %s", s.KeyID, pin)
	}
	if len(s.Signature) != 64 {
		t.Fatalf("signature is %d bytes, want 64 (P1363 for P-256)", len(s.Signature))
	}
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := got.Verify(&k.PublicKey); err != nil {
		t.Fatalf("the report read back does not verify: %v", err)
	}
	if !got.Report.ObservedAt.Equal(s.Report.ObservedAt) || got.Report.Neighbor != s.Report.Neighbor {
		t.Fatalf("read back %+v, want %+v", got.Report, s.Report)
	}
}

func TestVerifyRefusesTampering(t *testing.T) {
	k := newKey(t)
	s, err := Sign(testReport(), k)
	if err != nil {
		t.Fatal(err)
	}
	edits := map[string]func(*Report){
		"interface":   func(r *Report) { r.Interface = "eth1" },
		"chassisName": func(r *Report) { r.ChassisName = "sw-02" },
		"chassisType": func(r *Report) { r.ChassisIDType = "local" },
		"chassisID":   func(r *Report) { r.ChassisID = "6a:d7:ab:dc:5d:ea" },
		"portType":    func(r *Report) { r.PortIDType = "local" },
		"portID":      func(r *Report) { r.PortID = "ge-0/0/2" },
		"portDescr":   func(r *Report) { r.PortDescr = "" },
		"observedAt":  func(r *Report) { r.ObservedAt = r.ObservedAt.Add(time.Nanosecond) },
		// Moving bytes from one field into the next keeps their
		// concatenation; the length prefixes tell them apart.
		"boundary": func(r *Report) { r.PortID, r.PortDescr = r.PortID+"u", strings.TrimPrefix(r.PortDescr, "u") },
	}
	for name, edit := range edits {
		t.Run(name, func(t *testing.T) {
			c := s
			edit(&c.Report)
			if err := c.Verify(&k.PublicKey); !errors.Is(err, ErrSignature) {
				t.Fatalf("Verify after editing %s: %v, want ErrSignature", name, err)
			}
		})
	}
	other := newKey(t)
	if err := s.Verify(&other.PublicKey); !errors.Is(err, ErrSignature) {
		t.Fatalf("Verify with another key: %v, want ErrSignature", err)
	}
	// The right kid with another key's signature.
	forged, err := Sign(testReport(), other)
	if err != nil {
		t.Fatal(err)
	}
	forged.KeyID = s.KeyID
	if err := forged.Verify(&k.PublicKey); !errors.Is(err, ErrSignature) {
		t.Fatalf("Verify of another key's signature under the device's kid: %v, want ErrSignature", err)
	}
}

// A signature over the bare encoding, without the label, is not a
// report's: the label separates the report from anything else the device
// key signs.
func TestLabelSeparatesDomains(t *testing.T) {
	k := newKey(t)
	r := testReport()
	enc := r.Canonical()
	if !bytes.HasPrefix(enc, []byte(Label+"\x00")) {
		t.Fatalf("the canonical encoding does not start with the label: %q", enc[:40])
	}
	bare := sha256.Sum256(enc[len(Label)+1:])
	sig, err := pki.SignP1363(k, bare[:])
	if err != nil {
		t.Fatal(err)
	}
	pin, _ := pki.PinOf(&k.PublicKey)
	s := Signed{Report: r, KeyID: pin.String(), Signature: sig}
	if err := s.Verify(&k.PublicKey); !errors.Is(err, ErrSignature) {
		t.Fatalf("a signature without the label verified: %v", err)
	}
}

func TestCheckRefusesMalformed(t *testing.T) {
	cases := map[string]func(*Report){
		"no interface":  func(r *Report) { r.Interface = "" },
		"no chassis id": func(r *Report) { r.ChassisID = "" },
		"no port id":    func(r *Report) { r.PortID = "" },
		"no observation time": func(r *Report) {
			r.ObservedAt = time.Time{}
		},
		"port_descr is 257 bytes":            func(r *Report) { r.PortDescr = strings.Repeat("x", MaxField+1) },
		"chassis_name holds the unprintable": func(r *Report) { r.ChassisName = "sw\n01" },
		"interface is not UTF-8":             func(r *Report) { r.Interface = "eth\xff" },
	}
	k := newKey(t)
	for want, edit := range cases {
		r := testReport()
		edit(&r)
		err := r.Check()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check with %s: %v, want an error saying %q", want, err, want)
		}
		if _, err := Sign(r, k); err == nil {
			t.Errorf("Sign signed a report with %s", want)
		}
	}
}

func TestUnmarshalBounds(t *testing.T) {
	if _, err := Unmarshal(bytes.Repeat([]byte(" "), MaxEncoded+1)); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("Unmarshal of an oversized report: %v", err)
	}
	if _, err := Unmarshal([]byte(`{"report":{"interface":"eth0"}}`)); err == nil {
		t.Fatal("Unmarshal accepted a report without chassis and port")
	}
}

func FuzzUnmarshal(f *testing.F) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	s, err := Sign(testReport(), k)
	if err != nil {
		f.Fatal(err)
	}
	b, _ := s.Marshal()
	f.Add(b)
	f.Add([]byte(`{"report":{}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Unmarshal(b)
		if err != nil {
			return
		}
		if err := s.Report.Check(); err != nil {
			t.Fatalf("Unmarshal returned a report Check refuses: %v", err)
		}
		// Verification never panics, whatever the signature bytes.
		_ = s.Verify(&k.PublicKey)
	})
}
