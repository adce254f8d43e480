package kube

import (
	"fmt"
	"strings"
	"testing"
	"time"

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
	for _, c := range []struct {
		node string
		ttl  time.Duration
	}{{"Node_A", time.Hour}, {strings.Repeat("a", 64), time.Hour}, {"", time.Hour}, {"node-a", 0}} {
		if _, err := IssueBootstrapToken(t.Context(), client, c.node, c.ttl, time.Now()); err == nil {
			t.Errorf("IssueBootstrapToken(%q, %s) = nil error", c.node, c.ttl)
		}
	}
}
