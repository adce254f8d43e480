package identity

import (
	"crypto"
	"crypto/ecdsa"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/pki/pkitest"
)

const (
	msgNotJoined   = "this node has not joined (run bcd join)"
	msgMismatch    = "the node key does not match the node certificate; join again: bcd join --reset --yes < token.txt, with a fresh token (made with --allow-reclaim for a machine the control plane knows)"
	msgMismatchTPM = msgMismatch + "; the TPM derives another key from node.key (was the TPM cleared?)"
	// A node that joined with its TPM is told to join again with it: a
	// token it no longer has is not its way back.
	msgMismatchTPMJoin = "the node key does not match the node certificate; join again: bcd join --reset --yes --attestor tpm; the TPM derives another key from node.key (was the TPM cleared?)"
)

func TestLoadState(t *testing.T) {
	ca := newCA(t)
	k1, k2 := pkitest.NewKey(t), pkitest.NewKey(t)

	type want struct {
		key      *ecdsa.PrivateKey // the loaded key, nil when an error is expected
		errIs    error
		errText  string   // exact, when set
		contains []string // substrings of the error
		keyFile  []byte   // node.key's content afterwards, when set
		nextGone bool     // node.key.next must not exist afterwards
		nextKept bool     // node.key.next must still exist afterwards
		closed   bool     // a discarded signer was closed
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string)
		tpm   bool // load with tpmLoader
		want  want
	}{
		{
			name:  "not joined: empty directory",
			setup: func(t *testing.T, dir string) {},
			want:  want{errIs: ErrNotJoined, errText: msgNotJoined},
		},
		{
			name: "not joined: a key without identity.json",
			setup: func(t *testing.T, dir string) {
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
			},
			want: want{errIs: ErrNotJoined, errText: msgNotJoined},
		},
		{
			name: "joined",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k1.PublicKey))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
			},
			want: want{key: k1, keyFile: fileKeyPEM(t, k1)},
		},
		{
			name: "self-signed leaf",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, selfSignedIdentity(t, "n1", k1))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
			},
			want: want{key: k1},
		},
		{
			name: "next key the leaf certifies is promoted",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k2.PublicKey))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
				writeFile(t, dir, datadir.NextKeyFile, fileKeyPEM(t, k2))
			},
			want: want{key: k2, keyFile: fileKeyPEM(t, k2), nextGone: true},
		},
		{
			name: "next key promoted when node.key is missing",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k2.PublicKey))
				writeFile(t, dir, datadir.NextKeyFile, fileKeyPEM(t, k2))
			},
			want: want{key: k2, keyFile: fileKeyPEM(t, k2), nextGone: true},
		},
		{
			name: "next key the leaf does not certify is removed",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k1.PublicKey))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
				writeFile(t, dir, datadir.NextKeyFile, fileKeyPEM(t, k2))
			},
			want: want{key: k1, keyFile: fileKeyPEM(t, k1), nextGone: true},
		},
		{
			name: "garbage next key is removed",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k1.PublicKey))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
				writeFile(t, dir, datadir.NextKeyFile, []byte("garbage\x00\x01"))
			},
			want: want{key: k1, keyFile: fileKeyPEM(t, k1), nextGone: true},
		},
		{
			name: "empty next key is removed",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k1.PublicKey))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
				writeFile(t, dir, datadir.NextKeyFile, nil)
			},
			want: want{key: k1, nextGone: true},
		},
		{
			name: "next key of an unknown PEM type is removed",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k1.PublicKey))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
				writeFile(t, dir, datadir.NextKeyFile, keyPEM(t, k2, "SOMETHING ELSE"))
			},
			want: want{key: k1, nextGone: true},
		},
		{
			name: "unreadable next key is removed",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k1.PublicKey))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
				// A directory cannot be read as a file, even by root.
				if err := os.Mkdir(filepath.Join(dir, datadir.NextKeyFile), 0o700); err != nil {
					t.Fatal(err)
				}
			},
			want: want{key: k1, nextGone: true},
		},
		{
			name: "mismatched TPM next key is removed and closed",
			tpm:  true,
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k1.PublicKey))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
				writeFile(t, dir, datadir.NextKeyFile, keyPEM(t, k2, PEMTypeTPMKey))
			},
			want: want{key: k1, nextGone: true, closed: true},
		},
		{
			name: "TPM next key is kept when the loader has no TPM",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k2.PublicKey))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
				writeFile(t, dir, datadir.NextKeyFile, keyPEM(t, k2, PEMTypeTPMKey))
			},
			want: want{contains: []string{"load the next node key", datadir.NextKeyFile, "no TPM key loader"}, nextKept: true, keyFile: fileKeyPEM(t, k1)},
		},
		{
			name: "file-key node whose next key is in the TPM",
			tpm:  true,
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k2.PublicKey))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
				writeFile(t, dir, datadir.NextKeyFile, keyPEM(t, k2, PEMTypeTPMKey))
			},
			want: want{key: k2, keyFile: keyPEM(t, k2, PEMTypeTPMKey), nextGone: true},
		},
		{
			name: "key mismatch",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k1.PublicKey))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k2))
			},
			want: want{errIs: ErrKeyMismatch, errText: msgMismatch, keyFile: fileKeyPEM(t, k2)},
		},
		{
			name: "key mismatch after a mismatched next key was removed",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k1.PublicKey))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k2))
				writeFile(t, dir, datadir.NextKeyFile, fileKeyPEM(t, k2))
			},
			want: want{errIs: ErrKeyMismatch, errText: msgMismatch, nextGone: true},
		},
		{
			name: "TPM key mismatch",
			tpm:  true,
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k1.PublicKey))
				writeFile(t, dir, datadir.KeyFile, keyPEM(t, k2, PEMTypeTPMKey))
			},
			want: want{errIs: ErrKeyMismatch, errText: msgMismatchTPM, closed: true},
		},
		{
			name: "TPM key mismatch of a node that joined with its TPM names the TPM's way back",
			tpm:  true,
			setup: func(t *testing.T, dir string) {
				id := ca.identity(t, "n1", &k1.PublicKey)
				id.Attestor, id.KeyKind = "tpm", KeyKindTPM
				writeIdentity(t, dir, id)
				writeFile(t, dir, datadir.KeyFile, keyPEM(t, k2, PEMTypeTPMKey))
			},
			want: want{errIs: ErrKeyMismatch, errText: msgMismatchTPMJoin, closed: true},
		},
		{
			name: "TPM key that matches",
			tpm:  true,
			setup: func(t *testing.T, dir string) {
				id := ca.identity(t, "n1", &k1.PublicKey)
				id.KeyKind = KeyKindTPM
				writeIdentity(t, dir, id)
				writeFile(t, dir, datadir.KeyFile, keyPEM(t, k1, PEMTypeTPMKey))
			},
			want: want{key: k1},
		},
		{
			name: "corrupt identity.json",
			setup: func(t *testing.T, dir string) {
				writeFile(t, dir, datadir.IdentityFile, []byte(`{"version":1,"node_id":"n1","chain":[`))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
			},
			want: want{contains: []string{datadir.IdentityFile + " is corrupt", joinAgain("token")}},
		},
		{
			name: "identity.json with a bad certificate",
			setup: func(t *testing.T, dir string) {
				id := ca.identity(t, "n1", &k1.PublicKey)
				id.Chain[0] = []byte("not DER")
				writeIdentity(t, dir, id)
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
			},
			want: want{contains: []string{datadir.IdentityFile + " is corrupt", "chain certificate 0", joinAgain("token")}},
		},
		{
			name: "identity.json without a certificate",
			setup: func(t *testing.T, dir string) {
				id := ca.identity(t, "n1", &k1.PublicKey)
				id.Chain = nil
				writeIdentity(t, dir, id)
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
			},
			want: want{contains: []string{datadir.IdentityFile + " is corrupt", "no certificate", joinAgain("token")}},
		},
		{
			name: "corrupt identity.json leaves the next key alone",
			setup: func(t *testing.T, dir string) {
				writeFile(t, dir, datadir.IdentityFile, []byte(`garbage`))
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
				writeFile(t, dir, datadir.NextKeyFile, fileKeyPEM(t, k2))
			},
			want: want{contains: []string{datadir.IdentityFile + " is corrupt", joinAgain("token")}, nextKept: true},
		},
		{
			name: "identity.json of a newer format",
			setup: func(t *testing.T, dir string) {
				id := ca.identity(t, "n1", &k1.PublicKey)
				id.Version = Version + 1
				writeIdentity(t, dir, id)
				writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
			},
			want: want{contains: []string{datadir.IdentityFile, "format version 2", "upgrade bcd", joinAgain("token")}},
		},
		{
			name: "missing node.key",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k1.PublicKey))
			},
			want: want{errIs: fs.ErrNotExist, contains: []string{datadir.KeyFile + " is missing", joinAgain("token")}},
		},
		{
			name: "corrupt node.key",
			setup: func(t *testing.T, dir string) {
				writeIdentity(t, dir, ca.identity(t, "n1", &k1.PublicKey))
				writeFile(t, dir, datadir.KeyFile, []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
			},
			want: want{errIs: ErrInvalidKey, contains: []string{datadir.KeyFile + " is corrupt", joinAgain("token")}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			tt.setup(t, dir)
			var closed bool
			var o LoadOptions
			if tt.tpm {
				o.KeyLoader = tpmLoader(&closed)
			}
			st, err := LoadState(dir, o)
			w := tt.want
			if w.key != nil {
				if err != nil {
					t.Fatalf("LoadState: %v", err)
				}
				checkState(t, st, dir, w.key)
			} else {
				if err == nil {
					t.Fatal("LoadState succeeded, want an error")
				}
				if w.errIs != nil && !errors.Is(err, w.errIs) {
					t.Errorf("error %q does not wrap %v", err, w.errIs)
				}
				if w.errText != "" && err.Error() != w.errText {
					t.Errorf("error text\n got: %s\nwant: %s", err, w.errText)
				}
				for _, s := range w.contains {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not contain %q", err, s)
					}
				}
				if errors.Is(err, ErrNotJoined) != (w.errIs == ErrNotJoined) {
					t.Errorf("errors.Is(%q, ErrNotJoined) = %v", err, !(w.errIs == ErrNotJoined))
				}
			}
			if w.keyFile != nil {
				if got := readFile(t, dir, datadir.KeyFile); string(got) != string(w.keyFile) {
					t.Errorf("node.key afterwards is not the expected key")
				}
			}
			next := exists(t, filepath.Join(dir, datadir.NextKeyFile))
			if w.nextGone && next {
				t.Error("node.key.next still exists")
			}
			if w.nextKept && !next {
				t.Error("node.key.next was removed")
			}
			if w.closed != closed {
				t.Errorf("discarded signer closed = %v, want %v", closed, w.closed)
			}
		})
	}
}

// checkState checks a loaded state against the files and the expected key.
func checkState(t *testing.T, st *State, dir string, want *ecdsa.PrivateKey) {
	t.Helper()
	if st.Dir != dir {
		t.Errorf("Dir = %q, want %q", st.Dir, dir)
	}
	if !st.Key.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(&want.PublicKey) {
		t.Error("the loaded key is not the expected one")
	}
	if !want.PublicKey.Equal(st.Leaf.PublicKey) {
		t.Error("the leaf does not certify the expected key")
	}
	if len(st.Chain) == 0 || st.Chain[0] != st.Leaf {
		t.Error("Chain[0] is not Leaf")
	}
	if len(st.Chain) != len(st.Identity.Chain) || len(st.Roots) != len(st.Identity.Roots) {
		t.Errorf("parsed %d chain and %d root certificates, identity has %d and %d",
			len(st.Chain), len(st.Roots), len(st.Identity.Chain), len(st.Identity.Roots))
	}
	leaf, err := st.Identity.Leaf()
	if err != nil {
		t.Fatal(err)
	}
	if !leaf.Equal(st.Leaf) {
		t.Error("Identity.Leaf() differs from State.Leaf")
	}
}

func TestLoadStateNotJoinedWithoutDirectory(t *testing.T) {
	_, err := LoadState(filepath.Join(t.TempDir(), "missing"), LoadOptions{})
	if !errors.Is(err, ErrNotJoined) || err.Error() != msgNotJoined {
		t.Fatalf("err = %v, want %q", err, msgNotJoined)
	}
}

func TestLoadStateRoundTrip(t *testing.T) {
	ca := newCA(t)
	k := pkitest.NewKey(t)
	dir := t.TempDir()
	id := ca.identity(t, "node-7", &k.PublicKey)
	id.Version = 0 // written as Version
	if err := Persist(dir, id, fileKeyPEM(t, k), id.JoinedAt); err != nil {
		t.Fatal(err)
	}
	st, err := LoadState(dir, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := st.Identity
	if got.Version != Version || got.NodeID != id.NodeID || got.SPIFFEID != id.SPIFFEID ||
		got.TrustDomain != id.TrustDomain || got.Role != id.Role || got.Site != id.Site ||
		got.Generation != id.Generation || got.Attestor != id.Attestor || got.KeyKind != id.KeyKind ||
		!got.ServerTime.Equal(id.ServerTime) || !got.JoinedAt.Equal(id.JoinedAt) || !got.RenewedAt.IsZero() {
		t.Errorf("identity after a round trip = %+v, want %+v", got, id)
	}
	if strings.Contains(string(readFile(t, dir, datadir.IdentityFile)), "renewed_at") {
		t.Error("identity.json holds renewed_at before any renewal")
	}
}

func TestLoadPKCS8Key(t *testing.T) {
	k := pkitest.NewKey(t)
	if s, err := LoadPKCS8Key(fileKeyPEM(t, k)); err != nil || !k.PublicKey.Equal(s.Public()) {
		t.Fatalf("LoadPKCS8Key = %v, %v", s, err)
	}
	for name, in := range map[string][]byte{
		"empty":        nil,
		"not PEM":      []byte("garbage"),
		"other type":   keyPEM(t, k, "EC PRIVATE KEY"),
		"bad PKCS#8":   []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"),
		"not ECDSA":    keyPEM(t, ed25519Key(t), PEMTypeFileKey),
		"not P-256 EC": keyPEM(t, p384Key(t), PEMTypeFileKey),
	} {
		if _, err := LoadPKCS8Key(in); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("%s: err = %v, want ErrInvalidKey", name, err)
		}
	}
	if _, err := LoadPKCS8Key(keyPEM(t, k, PEMTypeTPMKey)); err == nil || errors.Is(err, ErrInvalidKey) {
		t.Errorf("TPM record: err = %v, want an error that is not ErrInvalidKey", err)
	}
}

func FuzzParse(f *testing.F) {
	ca := newCA(f)
	data, err := marshal(ca.identity(f, "n1", &pkitest.NewKey(f).PublicKey))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte(`{"version":1,"node_id":"x","chain":["AAAA"]}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		id, chain, _, err := parse(data)
		if err == nil && (id.NodeID == "" || len(chain) == 0 || chain[0] == nil) {
			t.Fatalf("parse accepted an identity without a node or leaf: %+v", id)
		}
	})
}
