package tpm_test

import (
	"bytes"
	"encoding/pem"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodetrust/nodetrust/tpm"
)

// recordTemplate returns the template a new record of the kind holds: a key
// template with 32 bytes in the unique field's x and an empty y.
func recordTemplate(t testing.TB, restricted bool, unique []byte) []byte {
	t.Helper()
	p := nodeKeyPublic(t, restricted)
	p.Unique = tpm2.NewTPMUPublicID(tpm2.TPMAlgECC, &tpm2.TPMSECCPoint{X: tpm2.TPM2BECCParameter{Buffer: unique}})
	return tpm2.Marshal(p)
}

func validRecord(t testing.TB) tpm.KeyRecord {
	return tpm.KeyRecord{
		Kind:      tpm.KindNodeKey,
		Hierarchy: 0x40000001,
		Template:  recordTemplate(t, false, bytes.Repeat([]byte{7}, 32)),
		Name:      append([]byte{0x00, 0x0B}, bytes.Repeat([]byte{9}, 32)...),
	}
}

func TestKeyRecordRoundTrip(t *testing.T) {
	for _, rec := range []tpm.KeyRecord{
		validRecord(t),
		{Kind: tpm.KindAK, Hierarchy: 0x40000001, Template: recordTemplate(t, true, bytes.Repeat([]byte{1}, 32))},
	} {
		t.Run(rec.Kind.String(), func(t *testing.T) {
			data, err := tpm.MarshalKeyRecord(rec)
			if err != nil {
				t.Fatal(err)
			}
			block, _ := pem.Decode(data)
			if block == nil || block.Type != "NODETRUST TPM KEY" {
				t.Fatalf("not a NODETRUST TPM KEY PEM block:\n%s", data)
			}
			got, err := tpm.ParseKeyRecord(data)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, rec) {
				t.Fatalf("round trip: got %+v, want %+v", got, rec)
			}
			if u := got.Unique(); len(u) != tpm.UniqueSize || !bytes.Contains(rec.Template, u) {
				t.Fatalf("Unique() = %x", u)
			}
		})
	}
}

func TestParseKeyRecordRefuses(t *testing.T) {
	marshal := func(f func(r *tpm.KeyRecord)) []byte {
		r := validRecord(t)
		f(&r)
		// Bypass MarshalKeyRecord's own checks by marshalling a valid
		// record and patching its DER, where needed; here the changes are
		// ones MarshalKeyRecord refuses too, so check both.
		if _, err := tpm.MarshalKeyRecord(r); err == nil {
			t.Fatalf("MarshalKeyRecord accepted %+v", r)
		}
		return nil
	}
	good, err := tpm.MarshalKeyRecord(validRecord(t))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(good)
	reencode := func(der []byte) []byte {
		return pem.EncodeToMemory(&pem.Block{Type: "NODETRUST TPM KEY", Bytes: der})
	}

	t.Run("not a record", func(t *testing.T) {
		for _, in := range [][]byte{nil, []byte("hello"), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}})} {
			if _, err := tpm.ParseKeyRecord(in); !errors.Is(err, tpm.ErrNotKeyRecord) {
				t.Errorf("ParseKeyRecord(%q): %v, want ErrNotKeyRecord", in, err)
			}
		}
	})

	cases := []struct {
		name   string
		in     []byte
		substr string
	}{
		{"data after the block", append(bytes.Clone(good), []byte("x")...), "after the PEM block"},
		{"PEM headers", pem.EncodeToMemory(&pem.Block{Type: "NODETRUST TPM KEY", Headers: map[string]string{"A": "b"}, Bytes: block.Bytes}), "headers"},
		{"truncated DER", reencode(block.Bytes[:len(block.Bytes)-1]), "parse TPM key record"},
		{"DER after the record", reencode(append(bytes.Clone(block.Bytes), 0x05, 0x00)), "after the record"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tpm.ParseKeyRecord(tc.in)
			if err == nil || errors.Is(err, tpm.ErrNotKeyRecord) {
				t.Fatalf("ParseKeyRecord: %v, want a parse error", err)
			}
			if !strings.Contains(err.Error(), tc.substr) {
				t.Fatalf("error %q does not mention %q", err, tc.substr)
			}
		})
	}

	t.Run("invalid records", func(t *testing.T) {
		marshal(func(r *tpm.KeyRecord) { r.Kind = 0 })
		marshal(func(r *tpm.KeyRecord) { r.Hierarchy = 0x4000000C }) // platform
		marshal(func(r *tpm.KeyRecord) { r.Template = nil })
		marshal(func(r *tpm.KeyRecord) { r.Template = recordTemplate(t, true, make([]byte, 32)) }) // an AK template in a node-key record
		marshal(func(r *tpm.KeyRecord) { r.Template = recordTemplate(t, false, make([]byte, 16)) })
		marshal(func(r *tpm.KeyRecord) { r.Name = []byte{1, 2, 3} })
		marshal(func(r *tpm.KeyRecord) { r.Template = tpm2.Marshal(tpm2.RSAEKTemplate) })
	})
}

func FuzzParseKeyRecord(f *testing.F) {
	good, err := tpm.MarshalKeyRecord(validRecord(f))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	block, _ := pem.Decode(good)
	f.Add(block.Bytes)
	f.Add([]byte("-----BEGIN NODETRUST TPM KEY-----\nMAA=\n-----END NODETRUST TPM KEY-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		in := data
		if !bytes.HasPrefix(data, []byte("-----BEGIN")) {
			in = pem.EncodeToMemory(&pem.Block{Type: "NODETRUST TPM KEY", Bytes: data})
		}
		rec, err := tpm.ParseKeyRecord(in)
		if err != nil {
			return
		}
		// A parsed record marshals and parses to itself.
		out, err := tpm.MarshalKeyRecord(rec)
		if err != nil {
			t.Fatalf("a parsed record does not marshal: %v", err)
		}
		again, err := tpm.ParseKeyRecord(out)
		if err != nil || !reflect.DeepEqual(again, rec) {
			t.Fatalf("round trip: %+v, %v; want %+v", again, err, rec)
		}
	})
}
