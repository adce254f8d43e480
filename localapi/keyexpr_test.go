package localapi

import (
	"strings"
	"testing"
)

func TestKeyExprRoundTrip(t *testing.T) {
	k := KeyExpr{Namespace: "fleet.example", Receiver: "node-a", Service: "leases", Method: "acquire", SenderNode: "node-b", Sender: "trainer"}
	s := k.String()
	if s != "fleet.example/@daemon/node-a/leases/acquire/@from/node-b/trainer" {
		t.Fatalf("String() = %q", s)
	}
	got, err := ParseKeyExpr(s)
	if err != nil || got != k {
		t.Fatalf("ParseKeyExpr(%q) = %+v, %v", s, got, err)
	}
}

func TestParseKeyExprRefuses(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"too few parts", "ns/@daemon/node-a/status/get", "is not <namespace>"},
		{"no daemon marker", "ns/daemon/node-a/status/get/@from/node-a/x", "is not <namespace>"},
		{"no from marker", "ns/@daemon/node-a/status/get/from/node-a/x", "is not <namespace>"},
		{"an empty namespace", "/@daemon/node-a/status/get/@from/node-a/x", "namespace is empty"},
		{"a wildcard receiver", "ns/@daemon/*/status/get/@from/node-a/x", "receiver"},
		{"an upper-case service", "ns/@daemon/node-a/Status/get/@from/node-a/x", "service"},
		{"a method with a dash", "ns/@daemon/node-a/status/g-t/@from/node-a/x", "method"},
		{"a bad sender node", "ns/@daemon/node-a/status/get/@from/Node/x", "sender node"},
		{"an empty sender", "ns/@daemon/node-a/status/get/@from/node-a/", "sender"},
		{"a wildcard sender", "ns/@daemon/node-a/status/get/@from/node-a/**", "sender"},
		{"too long", strings.Repeat("a", 1025), "more than 1024"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseKeyExpr(tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseKeyExpr(%q) = %v, want an error saying %q", tc.in, err, tc.want)
			}
		})
	}
}

func TestValidInstanceName(t *testing.T) {
	for name, ok := range map[string]bool{"trainer": true, "gpu-worker.2": true, "nodetrust-cli": false, "nodetrust-x": false, "Trainer": false, "": false, "-x": false} {
		if err := ValidInstanceName(name); (err == nil) != ok {
			t.Errorf("ValidInstanceName(%q) = %v, want ok %v", name, err, ok)
		}
	}
}

// FuzzParseKeyExpr: parsing never panics, and what parses prints back to
// the same text.
func FuzzParseKeyExpr(f *testing.F) {
	f.Add("fleet.example/@daemon/node-a/leases/acquire/@from/node-b/trainer")
	f.Add("ns/@daemon/node-a/status/get/@from/node-a/nodetrust-cli")
	f.Add("ns/@daemon//status/get/@from/node-a/x")
	f.Add("a/b/c/d/e/f/g/h/i")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseKeyExpr(s)
		if err != nil {
			return
		}
		if k.String() != s {
			t.Fatalf("%q parses to %+v, which prints %q", s, k, k.String())
		}
		if err := k.Validate(); err != nil {
			t.Fatalf("%q parses but does not validate: %v", s, err)
		}
	})
}
