package confirm

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"testing"
	"time"
)

func TestSignVerify(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	d := sha256.Sum256([]byte("report"))
	c := Confirmation{SessionID: "3f0c", ReportDigest: d[:], At: time.Unix(1700000000, 5)}
	sig, err := Sign(c, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := Verify(c, &key.PublicKey, sig); err != nil {
		t.Fatalf("verify: %v", err)
	}
	if err := Verify(c, &other.PublicKey, sig); !errors.Is(err, ErrSignature) {
		t.Errorf("another key verified: %v", err)
	}
	for name, changed := range map[string]Confirmation{
		"session": {SessionID: "3f0d", ReportDigest: c.ReportDigest, At: c.At},
		"report":  {SessionID: c.SessionID, ReportDigest: bytes.Repeat([]byte{1}, 32), At: c.At},
		"time":    {SessionID: c.SessionID, ReportDigest: c.ReportDigest, At: c.At.Add(time.Nanosecond)},
	} {
		if err := Verify(changed, &key.PublicKey, sig); !errors.Is(err, ErrSignature) {
			t.Errorf("another %s verified: %v", name, err)
		}
	}
}

func TestCanonicalKeepsFieldsApart(t *testing.T) {
	d := make([]byte, 32)
	at := time.Unix(1, 0)
	a := Confirmation{SessionID: "ab", ReportDigest: d, At: at}.Canonical()
	b := Confirmation{SessionID: "a", ReportDigest: d, At: at}.Canonical()
	if bytes.Equal(a, b) || !bytes.HasPrefix(a, []byte(Label+"\x00")) {
		t.Errorf("encodings: %x %x", a, b)
	}
}

func TestRefusesMalformed(t *testing.T) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	d := make([]byte, 32)
	for name, c := range map[string]Confirmation{
		"no session":   {ReportDigest: d, At: time.Now()},
		"long session": {SessionID: string(bytes.Repeat([]byte{'a'}, MaxSessionID+1)), ReportDigest: d, At: time.Now()},
		"short digest": {SessionID: "s", ReportDigest: d[:31], At: time.Now()},
		"no time":      {SessionID: "s", ReportDigest: d},
	} {
		if _, err := Sign(c, key); err == nil {
			t.Errorf("%s: signed", name)
		}
		if err := Verify(c, &key.PublicKey, make([]byte, 64)); err == nil || errors.Is(err, ErrSignature) {
			t.Errorf("%s: verify said %v", name, err)
		}
	}
}
