package pki

import (
	"crypto"
	"errors"
	"os"
	"strings"
	"testing"
)

// memKeys is a KeyGenerator and KeyOpener that keeps keys in memory under
// references "mem:<use>", standing in for a token in these tests of the
// mechanism (the PKCS#11 binding has its own tests with SoftHSM2).
type memKeys struct {
	keys      map[string]crypto.Signer
	discarded []KeyUse
	failOn    KeyUse
}

func newMemKeys() *memKeys { return &memKeys{keys: map[string]crypto.Signer{}} }

func (m *memKeys) generate(use KeyUse) (*ExternalKey, error) {
	if use == m.failOn {
		return nil, errors.New("token full")
	}
	k, err := GenerateKey()
	if err != nil {
		return nil, err
	}
	ref := "mem:" + string(use)
	m.keys[ref] = k
	return &ExternalKey{Signer: k, Ref: ref, Discard: func() error {
		delete(m.keys, ref)
		m.discarded = append(m.discarded, use)
		return nil
	}}, nil
}

func (m *memKeys) open(use KeyUse, ref string) (crypto.Signer, error) {
	k, ok := m.keys[ref]
	if !ok {
		return nil, errors.New("no such key")
	}
	return k, nil
}

func (m *memKeys) all() map[KeyUse]KeyGenerator {
	out := map[KeyUse]KeyGenerator{}
	for _, u := range KeyUses {
		out[u] = m.generate
	}
	return out
}

func TestInitWithExternalKeys(t *testing.T) {
	mem := newMemKeys()
	dir := t.TempDir()
	if _, err := Init(dir, InitOptions{TrustDomain: testTD, Now: testNow, ExternalKeys: mem.all()}); err != nil {
		t.Fatal(err)
	}
	t.Run("no key file is written for a key made elsewhere, only its reference", func(t *testing.T) {
		for _, u := range KeyUses {
			if _, err := os.Stat(Path(dir, u.KeyFile())); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s: stat = %v, want no such file", u.KeyFile(), err)
			}
			ref, err := ReadKeyRef(Path(dir, u.RefFile()))
			if err != nil || ref != "mem:"+string(u) {
				t.Errorf("%s = %q, %v", u.RefFile(), ref, err)
			}
		}
		locs, err := LocateKeys(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range locs {
			if l.File != "" || l.Ref != "mem:"+string(l.Use) {
				t.Errorf("%s is at %s", l.Use, l.Where())
			}
		}
	})
	t.Run("LoadAuthorityWith opens the keys through the opener and they match", func(t *testing.T) {
		a, err := LoadAuthorityWith(dir, mem.open)
		if err != nil {
			t.Fatal(err)
		}
		if a.JoinSigner != mem.keys["mem:join-signing"] {
			t.Error("the join signer is not the generated key")
		}
		leaf := issueLeaf(t, a.Issuer, mustKey(t), "n1", "worker", "", nil)
		if err := leaf.CheckSignatureFrom(a.NodeCA); err != nil {
			t.Error(err)
		}
	})
	t.Run("LoadAuthority without an opener says the key lives outside a file", func(t *testing.T) {
		_, err := LoadAuthority(dir)
		wantErr(t, err, nil, "node CA key lives outside a file ("+Path(dir, "node-ca.keyref")+" names mem:node-ca) and this program cannot open it")
	})
	t.Run("a key that is both a file and a reference is refused", func(t *testing.T) {
		if err := os.WriteFile(Path(dir, NodeCAKeyFile), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(Path(dir, NodeCAKeyFile))
		_, err := LoadAuthorityWith(dir, mem.open)
		wantErr(t, err, nil, "both "+Path(dir, NodeCAKeyFile)+" and "+Path(dir, "node-ca.keyref")+" exist")
	})
}

func TestInitDiscardsExternalKeysWhenItFails(t *testing.T) {
	mem := newMemKeys()
	mem.failOn = KeyJoinSigning
	dir := t.TempDir()
	_, err := Init(dir, InitOptions{TrustDomain: testTD, Now: testNow, ExternalKeys: mem.all()})
	wantErr(t, err, nil, "JoinService signing key: token full")
	if len(mem.keys) != 0 {
		t.Errorf("%d keys left in the generator after a failed Init", len(mem.keys))
	}
	if len(mem.discarded) != 5 {
		t.Errorf("discarded %v, want the five keys made before the failure", mem.discarded)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Errorf("a failed Init left %d entries in %s", len(entries), dir)
	}
}

func TestInitRefusesAnExistingKeyRef(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(Path(dir, KeyNodeCA.RefFile()), []byte("pkcs11:token=x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Init(dir, InitOptions{TrustDomain: testTD, Now: testNow})
	wantErr(t, err, ErrExists, Path(dir, "node-ca.keyref"))
}

func TestReadKeyRefRefusesBadReferences(t *testing.T) {
	tests := []struct {
		name, content, want string
	}{
		{"an empty file", "", "empty reference"},
		{"two lines", "pkcs11:token=a\npkcs11:token=b\n", "want one line of printable ASCII"},
		{"a space", "pkcs11:token=a b", "want one line"},
		{"a file over 4 KiB", strings.Repeat("a", 5000), "longer than 4096 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name+" is refused", func(t *testing.T) {
			p := Path(t.TempDir(), "x.keyref")
			if err := os.WriteFile(p, []byte(tt.content), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := ReadKeyRef(p)
			wantErr(t, err, nil, tt.want)
		})
	}
	t.Run("an unknown use is refused by name", func(t *testing.T) {
		_, err := ParseKeyUse("audit-ca")
		wantErr(t, err, nil, `key use "audit-ca" is not one of root-ca, node-ca, devid-ca, serving-ca, serving, join-signing, admin-ca`)
	})
}
