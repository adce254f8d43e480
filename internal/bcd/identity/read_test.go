package identity

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
	"github.com/nodetrust/nodetrust/pki/pkitest"
)

// snapshot returns the names and contents of the files in dir.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, e := range entries {
		files[e.Name()] = string(readFile(t, dir, e.Name()))
	}
	return files
}

func sameFiles(t *testing.T, dir string, before map[string]string) {
	t.Helper()
	after := snapshot(t, dir)
	if len(after) != len(before) {
		t.Fatalf("files changed: %d before, %d after", len(before), len(after))
	}
	for name, data := range before {
		if after[name] != data {
			t.Fatalf("%s changed", name)
		}
	}
}

func TestReadIdentity(t *testing.T) {
	ca := newCA(t)
	dir := t.TempDir()
	k := pkitest.NewKey(t)
	id := ca.identity(t, "n1", &k.PublicKey)
	writeIdentity(t, dir, id)
	writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k))
	before := snapshot(t, dir)

	got, leaf, chain, roots, err := ReadIdentity(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.NodeID != "n1" || got.Version != Version || got.Role != "worker" {
		t.Errorf("identity %+v", got)
	}
	if len(chain) != 2 || leaf != chain[0] || !bytes.Equal(leaf.Raw, id.Chain[0]) {
		t.Errorf("leaf and chain do not match identity.json")
	}
	if len(roots) != 1 || !roots[0].Equal(ca.Cert) {
		t.Errorf("roots do not match identity.json")
	}
	sameFiles(t, dir, before)

	if _, _, _, _, err := ReadIdentity(t.TempDir()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("no identity.json: %v", err)
	}

	// The checks of LoadState.
	path := filepath.Join(dir, datadir.IdentityFile)
	noNode := id
	noNode.NodeID = ""
	noNode.Version = Version
	newer := id
	newer.Version = Version + 1
	for name, data := range map[string][]byte{
		"corrupt JSON":     []byte("{"),
		"no node id":       mustMarshal(t, noNode),
		"newer version":    mustMarshal(t, newer),
		"no certificate":   []byte(`{"version":1,"node_id":"n1"}`),
		"bad certificate":  []byte(`{"version":1,"node_id":"n1","chain":["AAAA"]}`),
		"bad root":         []byte(`{"version":1,"node_id":"n1","chain":["` + b64(id.Chain[0]) + `"],"roots":["AAAA"]}`),
		"version 0 stored": []byte(`{"node_id":"n1","chain":["` + b64(id.Chain[0]) + `"]}`),
	} {
		writeFile(t, dir, datadir.IdentityFile, data)
		before := snapshot(t, dir)
		_, _, _, _, err := ReadIdentity(dir)
		if err == nil || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: %v, want an error naming %s", name, err, path)
		}
		sameFiles(t, dir, before)
	}
}

func mustMarshal(t *testing.T, id Identity) []byte {
	t.Helper()
	data, err := marshal(id)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestReadKey(t *testing.T) {
	ca := newCA(t)
	k1, k2, other := pkitest.NewKey(t), pkitest.NewKey(t), pkitest.NewKey(t)
	id1 := ca.identity(t, "n1", &k1.PublicKey)
	id2 := ca.identity(t, "n1", &k2.PublicKey)
	leaf := func(id Identity) *x509.Certificate {
		l, err := id.Leaf()
		if err != nil {
			t.Fatal(err)
		}
		return l
	}

	t.Run("node.key", func(t *testing.T) {
		dir := t.TempDir()
		writeIdentity(t, dir, id1)
		writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, k1))
		writeFile(t, dir, datadir.NextKeyFile, fileKeyPEM(t, k2))
		before := snapshot(t, dir)
		key, err := ReadKey(dir, leaf(id1), nil)
		if err != nil {
			t.Fatal(err)
		}
		if !samePublic(key.Public(), &k1.PublicKey) {
			t.Error("not node.key's key")
		}
		sameFiles(t, dir, before)
	})

	t.Run("mid-renewal node.key.next", func(t *testing.T) {
		// A renewal stored identity.json but has not promoted the next key.
		dir := t.TempDir()
		writeIdentity(t, dir, id2)
		writeFile(t, dir, datadir.KeyFile, keyPEM(t, k1, PEMTypeTPMKey))
		writeFile(t, dir, datadir.NextKeyFile, keyPEM(t, k2, PEMTypeTPMKey))
		before := snapshot(t, dir)
		var closed bool
		key, err := ReadKey(dir, leaf(id2), tpmLoader(&closed))
		if err != nil {
			t.Fatal(err)
		}
		if !samePublic(key.Public(), &k2.PublicKey) {
			t.Error("not node.key.next's key")
		}
		if !closed {
			t.Error("the signer of node.key, not the leaf's key, was not closed")
		}
		sameFiles(t, dir, before)
	})

	t.Run("no match", func(t *testing.T) {
		dir := t.TempDir()
		writeIdentity(t, dir, id1)
		writeFile(t, dir, datadir.KeyFile, fileKeyPEM(t, other))
		before := snapshot(t, dir)
		_, err := ReadKey(dir, leaf(id1), nil)
		if !errors.Is(err, ErrKeyMismatch) || !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("err = %v, want ErrKeyMismatch joined with node.key.next's absence", err)
		}
		sameFiles(t, dir, before)
	})

	t.Run("loader errors", func(t *testing.T) {
		dir := t.TempDir()
		writeIdentity(t, dir, id1)
		writeFile(t, dir, datadir.KeyFile, []byte("not a key"))
		writeFile(t, dir, datadir.NextKeyFile, fileKeyPEM(t, k1))
		before := snapshot(t, dir)
		busy := errors.New("TPM busy")
		_, err := ReadKey(dir, leaf(id1), func([]byte) (crypto.Signer, error) { return nil, busy })
		if !errors.Is(err, ErrKeyMismatch) || !errors.Is(err, busy) || !strings.Contains(err.Error(), datadir.NextKeyFile) {
			t.Errorf("err = %v, want ErrKeyMismatch joined with the loader's errors", err)
		}
		// An invalid node.key is passed over for node.key.next.
		key, err := ReadKey(dir, leaf(id1), nil)
		if err != nil || !samePublic(key.Public(), &k1.PublicKey) {
			t.Errorf("key %v, err %v: want node.key.next's key", key, err)
		}
		sameFiles(t, dir, before)
	})
}

func TestCloseSigner(t *testing.T) {
	var closed bool
	CloseSigner(closingSigner{PrivateKey: pkitest.NewKey(t), closed: &closed})
	if !closed {
		t.Error("a closer was not closed")
	}
	CloseSigner(pkitest.NewKey(t)) // not a closer: nothing to do
}

func b64(der []byte) string { return base64.StdEncoding.EncodeToString(der) }
