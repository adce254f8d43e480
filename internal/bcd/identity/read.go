package identity

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
)

// ReadIdentity reads and parses identity.json in dir without changing any
// file, for a reader other than the agent (which owns the files and repairs
// them with LoadState). It makes the checks LoadState makes of identity.json:
// the format version is Version, there is a node id and at least one
// certificate, and every certificate parses. It reads no key, and like
// LoadState it does not check the certificate's validity period or chain.
//
// leaf is chain[0]. An error reading the file is returned as os.ReadFile
// returns it (so it wraps fs.ErrNotExist when there is no identity.json); an
// error in its content names the file.
func ReadIdentity(dir string) (id Identity, leaf *x509.Certificate, chain, roots []*x509.Certificate, err error) {
	path := datadir.Layout(dir).Identity()
	data, err := os.ReadFile(path)
	if err != nil {
		return Identity{}, nil, nil, nil, err
	}
	id, chain, roots, err = parse(data)
	if err != nil {
		return Identity{}, nil, nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return id, chain[0], chain, roots, nil
}

// ReadKey returns the key in dir that leaf certifies: the one of node.key or,
// while a renewal has stored the certificate but not yet promoted its key,
// of node.key.next. It tries node.key first and only reads: unlike LoadState
// it renames and removes nothing. load turns the PEM bytes into a signer; nil
// means LoadPKCS8Key. A signer it loads that is not leaf's key is released
// with CloseSigner.
//
// When neither file holds leaf's key the error wraps ErrKeyMismatch, joined
// with the errors reading or loading the two files; any of those counts as
// "not the key", since a reader that does not own the files may look in the
// middle of a renewal.
func ReadKey(dir string, leaf *x509.Certificate, load KeyLoader) (crypto.Signer, error) {
	if load == nil {
		load = LoadPKCS8Key
	}
	var errs []error
	for _, name := range []string{datadir.KeyFile, datadir.NextKeyFile} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		k, err := load(b)
		if err != nil {
			errs = append(errs, fmt.Errorf("load %s: %w", name, err))
			continue
		}
		if samePublic(k.Public(), leaf.PublicKey) {
			return k, nil
		}
		CloseSigner(k)
	}
	mismatch := fmt.Errorf("%w: neither %s nor %s in %s is its key", ErrKeyMismatch, datadir.KeyFile, datadir.NextKeyFile, dir)
	return nil, errors.Join(append([]error{mismatch}, errs...)...)
}
