package kube

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

func TestBootstrapTokenHidesItsSecret(t *testing.T) {
	tok := BootstrapToken{ID: "abcdef", Node: "node-a", Expires: time.Now(), secret: "0123456789abcdef"}
	if tok.Bearer() != "abcdef.0123456789abcdef" {
		t.Fatalf("Bearer() = %q", tok.Bearer())
	}
	for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
		if s := fmt.Sprintf(f, tok); strings.Contains(s, tok.secret) {
			t.Errorf("%s shows the secret: %s", f, s)
		}
	}
}

func TestRandomString(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		s, err := randomString(tokenSecretLen)
		if err != nil {
			t.Fatal(err)
		}
		if len(s) != tokenSecretLen || strings.Trim(s, tokenAlphabet) != "" {
			t.Fatalf("randomString = %q: want %d characters of [a-z0-9]", s, tokenSecretLen)
		}
		if seen[s] {
			t.Fatalf("randomString repeated %q", s)
		}
		seen[s] = true
	}
}

func TestIssueRefusesBadInput(t *testing.T) {
	// Refused before any request: a nil client is never reached.
	var client kubernetes.Interface
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := IssueBootstrapToken(t.Context(), client, nil, "node-a", time.Hour, time.Now()); err == nil {
		t.Error("IssueBootstrapToken with no signer = nil error")
	}
	for _, c := range []struct {
		node string
		ttl  time.Duration
	}{{"Node_A", time.Hour}, {strings.Repeat("a", 64), time.Hour}, {"", time.Hour}, {"node-a", 0}} {
		if _, err := IssueBootstrapToken(t.Context(), client, key, c.node, c.ttl, time.Now()); err == nil {
			t.Errorf("IssueBootstrapToken(%q, %s) = nil error", c.node, c.ttl)
		}
	}
}

// TestTokenSignature: a token's signature verifies with the key that made
// it, and fails with another key, another id, node or expiration, or none.
func TestTokenSignature(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	exp := []byte("2026-12-02T18:00:00Z")
	sig, err := signToken(key, "abcdef", "node-a", exp)
	if err != nil {
		t.Fatal(err)
	}
	secret := func(id, node, expiration, sig string) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: tokenSecretPrefix + id, Labels: map[string]string{NodeLabel: node},
				Annotations: map[string]string{SignatureAnnotation: sig}},
			Data: map[string][]byte{"token-id": []byte(id), "expiration": []byte(expiration)},
		}
	}
	if !signedByFleetd(&key.PublicKey, secret("abcdef", "node-a", string(exp), sig)) {
		t.Fatal("fleetd's own signature does not verify")
	}
	renamed := secret("abcdef", "node-a", string(exp), sig)
	renamed.Name = tokenSecretPrefix + "zzzzzz"
	raw, _ := base64.StdEncoding.DecodeString(sig)
	raw[len(raw)-1] ^= 1
	for name, c := range map[string]struct {
		pub *ecdsa.PublicKey
		s   *corev1.Secret
	}{
		"another key":        {&other.PublicKey, secret("abcdef", "node-a", string(exp), sig)},
		"no key":             {nil, secret("abcdef", "node-a", string(exp), sig)},
		"another node":       {&key.PublicKey, secret("abcdef", "node-b", string(exp), sig)},
		"another id":         {&key.PublicKey, secret("abcdeg", "node-a", string(exp), sig)},
		"another name":       {&key.PublicKey, renamed},
		"a later expiration": {&key.PublicKey, secret("abcdef", "node-a", "2027-12-02T18:00:00Z", sig)},
		"no signature":       {&key.PublicKey, secret("abcdef", "node-a", string(exp), "")},
		"not base64":         {&key.PublicKey, secret("abcdef", "node-a", string(exp), "!!")},
		"a flipped bit":      {&key.PublicKey, secret("abcdef", "node-a", string(exp), base64.StdEncoding.EncodeToString(raw))},
	} {
		if signedByFleetd(c.pub, c.s) {
			t.Errorf("%s: the signature verifies", name)
		}
	}
}
