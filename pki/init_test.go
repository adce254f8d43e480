package pki

import (
	"bytes"
	"crypto/x509"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestInitWritesAllFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pki")
	b, err := Init(dir, InitOptions{TrustDomain: testTD, ServerName: "fleet.example.test", Now: testNow})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{dir, Path(dir, AdminDir)} {
		st, err := os.Stat(d)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o700 {
			t.Errorf("%s mode = %v, want 0700", d, st.Mode().Perm())
		}
	}
	want := map[string]fs.FileMode{
		RootCACertFile: 0o644, RootCAKeyFile: 0o600,
		NodeCACertFile: 0o644, NodeCAKeyFile: 0o600,
		DevIDCACertFile: 0o644, DevIDCAKeyFile: 0o600,
		ServingCACertFile: 0o644, ServingCAKeyFile: 0o600,
		ServingCertFile: 0o644, ServingKeyFile: 0o600,
		JoinSigningKeyFile:    0o600,
		JoinEncryptionKeyFile: 0o600, JoinEncryptionJWKFile: 0o644,
		AdminCACertFile: 0o644, AdminCAKeyFile: 0o600,
		OwnerCertFile: 0o644, OwnerKeyFile: 0o600,
		BundleFile: 0o644,
	}
	if len(want) != len(InitFiles) {
		t.Fatalf("test knows %d files, Init writes %d", len(want), len(InitFiles))
	}
	for name, mode := range want {
		t.Run(name+" is written with mode "+mode.String(), func(t *testing.T) {
			st, err := os.Stat(Path(dir, name))
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != mode || !st.Mode().IsRegular() || st.Size() == 0 {
				t.Errorf("mode %v, size %d; want regular file, mode %v", st.Mode(), st.Size(), mode)
			}
		})
	}

	read, err := ReadBundle(Path(dir, BundleFile))
	if err != nil {
		t.Fatal(err)
	}
	if *read != *b {
		t.Errorf("bundle file %+v differs from returned %+v", read, b)
	}
	if b.TrustDomain != testTD || b.ServerName != "fleet.example.test" {
		t.Errorf("bundle = %+v", b)
	}
}

func TestInitCertificates(t *testing.T) {
	a, dir := newAuthority(t, "")
	roots := x509.NewCertPool()
	roots.AddCert(a.Root)
	verify := func(t *testing.T, leaf *x509.Certificate, inter *x509.Certificate, eku x509.ExtKeyUsage, dns string) {
		t.Helper()
		pool := x509.NewCertPool()
		pool.AddCert(inter)
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: pool, CurrentTime: testNow,
			KeyUsages: []x509.ExtKeyUsage{eku}, DNSName: dns}); err != nil {
			t.Errorf("verify: %v", err)
		}
	}

	t.Run("the serving certificate names the server, localhost and the loopback IPs", func(t *testing.T) {
		leaf := a.ServingCert.Leaf
		if !slices.Equal(leaf.DNSNames, []string{"fleet.example.test", "localhost"}) {
			t.Errorf("DNSNames = %q", leaf.DNSNames)
		}
		if len(leaf.IPAddresses) != 2 || !leaf.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) || !leaf.IPAddresses[1].Equal(net.IPv6loopback) {
			t.Errorf("IPAddresses = %v", leaf.IPAddresses)
		}
		if len(a.ServingCert.Certificate) != 2 {
			t.Errorf("serving chain has %d certificates, want 2", len(a.ServingCert.Certificate))
		}
		verify(t, leaf, a.ServingCA, x509.ExtKeyUsageServerAuth, "fleet.example.test")
		if leaf.NotAfter.Sub(testNow) > 366*24*time.Hour {
			t.Errorf("serving certificate lasts until %v", leaf.NotAfter)
		}
	})
	t.Run("the owner credential is a client certificate of the admin CA with role owner", func(t *testing.T) {
		certs, err := ReadCerts(Path(dir, OwnerCertFile))
		if err != nil {
			t.Fatal(err)
		}
		key, err := ReadPrivateKey(Path(dir, OwnerKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		owner := certs[0]
		if !publicKeysEqual(owner.PublicKey, key.Public()) {
			t.Error("owner.key does not match owner.crt")
		}
		if owner.Subject.CommonName != "owner" || len(owner.URIs) != 1 || owner.URIs[0].String() != "spiffe://example.test/admin/owner" {
			t.Errorf("owner subject %v, URIs %v", owner.Subject, owner.URIs)
		}
		if !slices.Equal(owner.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
			t.Errorf("ExtKeyUsage = %v", owner.ExtKeyUsage)
		}
		verify(t, owner, a.AdminCA, x509.ExtKeyUsageClientAuth, "")
		info, err := ParseAdminCert(owner, "example.test")
		if err != nil || info.Name != OwnerName || info.Role != OwnerRole {
			t.Errorf("ParseAdminCert(owner) = %+v, %v", info, err)
		}
	})
	t.Run("the CAs chain to the root with the right path lengths", func(t *testing.T) {
		if !a.NodeCA.IsCA || a.NodeCA.MaxPathLen != 0 || !a.NodeCA.MaxPathLenZero {
			t.Errorf("node CA: IsCA %v MaxPathLen %d", a.NodeCA.IsCA, a.NodeCA.MaxPathLen)
		}
		if got := a.Root.NotAfter.Sub(a.NodeCA.NotAfter); got <= 0 {
			t.Errorf("node CA outlives the root by %v", -got)
		}
		if years := a.Root.NotAfter.Year() - testNow.Year(); years != 10 {
			t.Errorf("root lasts %d years, want 10", years)
		}
		if years := a.NodeCA.NotAfter.Year() - testNow.Year(); years != 5 {
			t.Errorf("node CA lasts %d years, want 5", years)
		}
		leaf := issueLeaf(t, a.Issuer, mustKey(t), "n1", "worker", "", nil)
		verify(t, leaf, a.NodeCA, x509.ExtKeyUsageClientAuth, "")
	})
	t.Run("the DevID CA is a CA of its own under the root, apart from the node CA", func(t *testing.T) {
		d := a.DevIDCA
		if !d.IsCA || d.MaxPathLen != 0 || !d.MaxPathLenZero || d.Subject.CommonName != "nodetrust DevID CA" {
			t.Errorf("DevID CA: IsCA %v MaxPathLen %d subject %v", d.IsCA, d.MaxPathLen, d.Subject)
		}
		if publicKeysEqual(d.PublicKey, a.NodeCA.PublicKey) {
			t.Error("the DevID CA shares the node CA's key")
		}
		leaf := issueLeaf(t, a.DevIDIssuer, mustKey(t), "n1", "worker", "", nil)
		verify(t, leaf, a.DevIDCA, x509.ExtKeyUsageClientAuth, "")
		if err := leaf.CheckSignatureFrom(a.NodeCA); err == nil {
			t.Error("a DevID certificate verifies under the node CA")
		}
	})
	t.Run("the bundle pins the serving CA and the join keys", func(t *testing.T) {
		if a.Bundle.ServingCASPKIPin != PinOfCert(a.ServingCA) {
			t.Error("serving CA pin")
		}
		if a.Bundle.JoinSigningKeyPin != mustPinOf(t, a.JoinSigner.Public()) {
			t.Error("join signing key pin")
		}
		if a.Bundle.JoinEncryptionKeyPin != a.JoinEncryption.Public().Pin() {
			t.Error("join encryption key pin")
		}
	})
}

// snapshot records every file under dir: its mode and content.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := make(map[string]string)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var data []byte
		if d.Type().IsRegular() {
			if data, err = os.ReadFile(p); err != nil {
				return err
			}
		}
		out[p] = info.Mode().String() + " " + string(data)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestInitRefusesExistingFiles(t *testing.T) {
	t.Run("a second Init refuses and changes nothing", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := Init(dir, InitOptions{TrustDomain: testTD, Now: testNow}); err != nil {
			t.Fatal(err)
		}
		before := snapshot(t, dir)
		_, err := Init(dir, InitOptions{TrustDomain: testTD, Now: testNow})
		wantErr(t, err, ErrExists, Path(dir, RootCAKeyFile)+": pki file already exists; choose another --dir or remove it")
		after := snapshot(t, dir)
		if len(before) != len(after) {
			t.Fatalf("%d entries before, %d after", len(before), len(after))
		}
		for p, v := range before {
			if after[p] != v {
				t.Errorf("%s changed", p)
			}
		}
	})
	for _, name := range []string{BundleFile, OwnerKeyFile, JoinEncryptionJWKFile} {
		t.Run("an existing "+name+" alone stops Init before it writes", func(t *testing.T) {
			dir := t.TempDir()
			if err := os.MkdirAll(filepath.Dir(Path(dir, name)), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(Path(dir, name), []byte("keep me"), 0o600); err != nil {
				t.Fatal(err)
			}
			before := snapshot(t, dir)
			_, err := Init(dir, InitOptions{TrustDomain: testTD, Now: testNow})
			wantErr(t, err, ErrExists, Path(dir, name))
			after := snapshot(t, dir)
			if len(after) != len(before) {
				t.Errorf("Init wrote %d entries despite refusing", len(after)-len(before))
			}
		})
	}
}

func TestInitRefusesBadOptions(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, want string
		dir        string
		o          InitOptions
	}{
		{"an invalid trust domain is refused", "trust domain", "", InitOptions{TrustDomain: "Example"}},
		{"an IP as server name is refused", "is an IP address", "", InitOptions{TrustDomain: testTD, ServerName: "10.0.0.1"}},
		{"a server name with a space is refused", "not allowed in a DNS name", "", InitOptions{TrustDomain: testTD, ServerName: "a b"}},
		{"a server name with an empty label is refused", "empty label", "", InitOptions{TrustDomain: testTD, ServerName: "a..b"}},
		{"a server name label ending in a dash is refused", "ending in '-'", "", InitOptions{TrustDomain: testTD, ServerName: "a-.b"}},
		{"an unknown KEM is refused", "unknown join encryption KEM", "", InitOptions{TrustDomain: testTD, KEM: "rsa"}},
		{"a malformed IP is refused", "is not an IP address", "", InitOptions{TrustDomain: testTD, ServerIPs: []net.IP{{1, 2, 3}}}},
		{"a file as directory is refused", "is not a directory", file, InitOptions{TrustDomain: testTD}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.dir
			if dir == "" {
				dir = filepath.Join(t.TempDir(), "pki")
			}
			_, err := Init(dir, tt.o)
			wantErr(t, err, nil, tt.want)
			if tt.dir == "" {
				if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("Init created %s despite refusing", dir)
				}
			}
		})
	}
}

func TestReadBundleRefuses(t *testing.T) {
	pin := mustPinOf(t, mustKey(t).Public()).String()
	tests := []struct {
		name, want, in string
	}{
		{"a missing pin is named", "join_signing_key_pin is missing",
			`{"trust_domain":"a.test","server_name":"x","serving_ca_spki_pin":"` + pin + `","join_encryption_key_pin":"` + pin + `"}`},
		{"a malformed pin is named", "serving_ca_spki_pin: parse pin",
			`{"trust_domain":"a.test","server_name":"x","serving_ca_spki_pin":"sha256:AB","join_signing_key_pin":"` + pin + `","join_encryption_key_pin":"` + pin + `"}`},
		{"an invalid trust domain is named", "trust_domain",
			`{"trust_domain":"A","server_name":"x","serving_ca_spki_pin":"` + pin + `","join_signing_key_pin":"` + pin + `","join_encryption_key_pin":"` + pin + `"}`},
		{"a missing server name is named", "server_name is missing",
			`{"trust_domain":"a.test","serving_ca_spki_pin":"` + pin + `","join_signing_key_pin":"` + pin + `","join_encryption_key_pin":"` + pin + `"}`},
		{"not JSON is refused", "parse bundle", `{`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), BundleFile)
			if err := os.WriteFile(path, []byte(tt.in), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := ReadBundle(path)
			wantErr(t, err, nil, tt.want)
			if err != nil && !bytes.Contains([]byte(err.Error()), []byte(path)) {
				t.Errorf("error %q does not name %s", err, path)
			}
		})
	}
}
