package command

import (
	"os"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/pki"
)

func TestParseKeyPlaces(t *testing.T) {
	t.Run("a bare URI places the CAs and the JoinService key, each use chosen on its own after", func(t *testing.T) {
		places, err := parseKeyPlaces([]string{
			"pkcs11:token=online;object=fleet",
			"root-ca=pkcs11:token=offline;object=root",
			"join-signing=file",
			"serving=pkcs11:token=online",
		})
		if err != nil {
			t.Fatal(err)
		}
		want := map[pki.KeyUse]string{
			pki.KeyRootCA:  "offline/root",
			pki.KeyNodeCA:  "online/fleet-node-ca",
			pki.KeyDevIDCA: "online/fleet-devid-ca",
			pki.KeyAdminCA: "online/fleet-admin-ca",
			pki.KeyServing: "online/nodetrust-serving",
		}
		if len(places) != len(want) {
			t.Errorf("%d places, want %d: %v", len(places), len(want), places)
		}
		for use, w := range want {
			p, ok := places[use]
			if got := p.uri.Token + "/" + p.label; !ok || got != w {
				t.Errorf("%s is at %q, want %q", use, got, w)
			}
		}
	})
	for _, tt := range []struct {
		name   string
		values []string
		want   string
	}{
		{"two bare URIs", []string{"pkcs11:token=a", "pkcs11:token=b"}, "two URIs for the default keys"},
		{"a use named twice", []string{"node-ca=file", "node-ca=pkcs11:token=a"}, "named twice"},
		{"an unknown use", []string{"audit-ca=pkcs11:token=a"}, `key use "audit-ca"`},
		{"one id for several keys", []string{"pkcs11:token=a;id=%01"}, "names an id= for several keys"},
		{"neither URI nor USE=", []string{"fleet"}, "neither a pkcs11: URI nor USE=URI"},
		{"a PIN in the URI", []string{"pkcs11:token=a?pin-value=1"}, "a PIN must not sit in a URI"},
	} {
		t.Run(tt.name+" is refused", func(t *testing.T) {
			_, err := parseKeyPlaces(tt.values)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("parseKeyPlaces(%q) = %v, want %q", tt.values, err, tt.want)
			}
		})
	}
}

func TestInitAddsTheDevIDCAToAnOlderPKI(t *testing.T) {
	dir := t.TempDir() + "/pki"
	if _, err := pki.Init(dir, pki.InitOptions{TrustDomain: "example.test"}); err != nil {
		t.Fatal(err)
	}
	if _, stderr, code := run(t, "init", "--dir", dir, "--add-devid-ca"); code == 0 || !strings.Contains(stderr, "exists") {
		t.Fatalf("--add-devid-ca on a PKI with a DevID CA: exit %d, %s", code, stderr)
	}
	for _, f := range []string{pki.DevIDCACertFile, pki.DevIDCAKeyFile} {
		if err := os.Remove(pki.Path(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pki.LoadAuthority(dir); err == nil || !strings.Contains(err.Error(), "--add-devid-ca") {
		t.Fatalf("LoadAuthority without the DevID CA: %v", err)
	}
	stdout, stderr, code := run(t, "init", "--dir", dir, "--add-devid-ca")
	if code != 0 || !strings.Contains(stdout, "DevID CA added") {
		t.Fatalf("--add-devid-ca: exit %d, %s %s", code, stdout, stderr)
	}
	if a, err := pki.LoadAuthority(dir); err != nil || a.DevIDIssuer == nil {
		t.Fatalf("LoadAuthority after --add-devid-ca: %v", err)
	}
	if _, stderr, code := run(t, "init", "--add-devid-ca"); code != 2 || !strings.Contains(stderr, "needs --dir") {
		t.Errorf("--add-devid-ca without --dir: exit %d, %s", code, stderr)
	}
}
