package identity

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"github.com/nodetrust/nodetrust/internal/atomicfile"
	"github.com/nodetrust/nodetrust/internal/bcd/datadir"
)

// PEM block types of node.key and node.key.next.
const (
	// PEMTypeFileKey is a PKCS#8 private key held in the file itself.
	PEMTypeFileKey = "PRIVATE KEY"
	// PEMTypeTPMKey is the record of a key held in the TPM: not a secret, but
	// what the TPM derives the key from.
	PEMTypeTPMKey = "NODETRUST TPM KEY"
)

// WayBack is the command that replaces an identity only a new join repairs,
// for a node that joins with attestor: with the TPM ("tpm"), whose EK
// reclaims the node without a token, or else with a fresh token on standard
// input (bcd join --reset --yes moves the identity aside and joins in one
// step).
func WayBack(attestor string) string {
	if attestor == "tpm" {
		return "bcd join --reset --yes --attestor tpm"
	}
	return "bcd join --reset --yes < token.txt, with a fresh token (made with --allow-reclaim for a machine the control plane knows)"
}

// joinAgain ends every message about an identity only a new join repairs.
func joinAgain(attestor string) string { return "join again: " + WayBack(attestor) }

// tpmHint is added to ErrKeyMismatch's message when node.key is a TPM record.
const tpmHint = "the TPM derives another key from node.key (was the TPM cleared?)"

var (
	// ErrNotJoined means the data directory holds no identity.json. LoadState's
	// error reads "this node has not joined (run bcd join)".
	ErrNotJoined = errors.New("this node has not joined")
	// ErrKeyMismatch means node.key is not the key the node certificate
	// certifies (for ReadKey: nor is node.key.next). LoadState's error reads
	// "the node key does not match the node certificate; join again: " and
	// the node's [WayBack].
	ErrKeyMismatch = errors.New("the node key does not match the node certificate")
	// ErrInvalidKey is wrapped by a KeyLoader's error when the bytes are not a
	// key it could ever load (no PEM, a bad encoding, a wrong algorithm). Any
	// other loader error is taken to be passing (a TPM that is busy, a helper
	// that is down), and LoadState then changes no file.
	ErrInvalidKey = errors.New("invalid node key")
)

// KeyLoader turns the PEM bytes of node.key (or node.key.next) into a signer.
// It returns an error wrapping ErrInvalidKey for bytes that are not a key it
// could load. A signer that LoadState discards (a next key it removes, a node
// key that does not match) is closed when it implements io.Closer.
type KeyLoader func(pemBytes []byte) (crypto.Signer, error)

// LoadOptions configures LoadState.
type LoadOptions struct {
	// KeyLoader loads node.key and node.key.next; nil means LoadPKCS8Key.
	// A node whose key is in the TPM passes a loader that understands
	// PEMTypeTPMKey records (and PEMTypeFileKey, for a file-key node moving
	// into the TPM).
	KeyLoader KeyLoader
	// Attestor is the attestor this host joins with (config.toml's [join]
	// attestor): the way back an error names when identity.json cannot
	// say which attestor made it.
	Attestor string
}

// LoadPKCS8Key is the default KeyLoader: it loads a PEMTypeFileKey block
// holding a PKCS#8 ECDSA P-256 key. For a PEMTypeTPMKey record it returns an
// error that does not wrap ErrInvalidKey, since the record is valid for a
// loader that has the TPM.
func LoadPKCS8Key(pemBytes []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		return nil, fmt.Errorf("%w: no PEM block", ErrInvalidKey)
	}
	switch block.Type {
	case PEMTypeFileKey:
	case PEMTypeTPMKey:
		return nil, errors.New("the node key is held in the TPM, and no TPM key loader was given")
	default:
		return nil, fmt.Errorf("%w: PEM type %q", ErrInvalidKey, block.Type)
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidKey, err)
	}
	ek, ok := k.(*ecdsa.PrivateKey)
	if !ok || ek.Curve != elliptic.P256() {
		return nil, fmt.Errorf("%w: not an ECDSA P-256 key", ErrInvalidKey)
	}
	return ek, nil
}

// loadError is an error whose message is written for the operator and ends
// with the way back, and which still unwraps to its cause.
type loadError struct {
	msg string
	err error
}

func (e *loadError) Error() string { return e.msg }
func (e *loadError) Unwrap() error { return e.err }

// readError describes a file that exists but cannot be read.
func readError(err error) error {
	return &loadError{
		msg: err.Error() + "; run bcd as root or as the user the data directory belongs to",
		err: err,
	}
}

// LoadState loads the identity in dir, following the seed's three rules in
// order:
//
//  1. Without identity.json the node has not joined: the error wraps
//     ErrNotJoined.
//  2. A node.key.next whose public key the stored leaf certifies is renamed
//     over node.key (a renewal stopped after it stored the certificate). Any
//     other node.key.next, also one that cannot be read or is not a key, is
//     removed (a renewal stopped before). A loader error that does not wrap
//     ErrInvalidKey leaves node.key.next in place and is returned.
//  3. node.key must hold the leaf's key; otherwise the error wraps
//     ErrKeyMismatch, and for a TPM record says the TPM may have been cleared.
//
// A corrupt identity.json, a missing or invalid node.key, or an identity.json
// of a newer format gives an error naming the file and the way back. Apart
// from rule 2, LoadState changes nothing, and it does not check the
// certificate's validity period or chain.
func LoadState(dir string, o LoadOptions) (*State, error) {
	load := o.KeyLoader
	if load == nil {
		load = LoadPKCS8Key
	}

	// Rule 1: identity.json.
	idPath := datadir.Layout(dir).Identity()
	data, err := os.ReadFile(idPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w (run bcd join)", ErrNotJoined)
	}
	if err != nil {
		return nil, readError(err)
	}
	var v struct {
		Version int `json:"version"`
	}
	if json.Unmarshal(data, &v) == nil && v.Version > Version {
		return nil, fmt.Errorf("%s has format version %d, which this bcd cannot read; upgrade bcd, or %s",
			idPath, v.Version, joinAgain(o.Attestor))
	}
	id, chain, roots, err := parse(data)
	if err != nil {
		return nil, &loadError{
			msg: fmt.Sprintf("%s is corrupt (%v); %s", idPath, err, joinAgain(o.Attestor)),
			err: err,
		}
	}
	attestor := id.Attestor
	if attestor == "" {
		attestor = o.Attestor
	}
	wayBack := joinAgain(attestor)
	leaf := chain[0]

	// Rule 2: a renewal's next key.
	var key crypto.Signer
	var keyPEM []byte
	keyPath := datadir.Layout(dir).Key()
	nextPath := datadir.Layout(dir).NextKey()
	nextPEM, err := os.ReadFile(nextPath)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		if err := removeNext(nextPath); err != nil {
			return nil, err
		}
	default:
		next, err := load(nextPEM)
		switch {
		case err == nil && samePublic(next.Public(), leaf.PublicKey):
			if err := atomicfile.Rename(nextPath, keyPath); err != nil {
				CloseSigner(next)
				return nil, fmt.Errorf("promote the next node key %s: %w", nextPath, err)
			}
			key, keyPEM = next, nextPEM
		case err == nil || errors.Is(err, ErrInvalidKey):
			CloseSigner(next)
			if err := removeNext(nextPath); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("load the next node key %s: %w", nextPath, err)
		}
	}

	// Rule 3: node.key is the leaf's key.
	if key == nil {
		keyPEM, err = os.ReadFile(keyPath)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, &loadError{
				msg: fmt.Sprintf("the node key %s is missing; %s", keyPath, wayBack),
				err: err,
			}
		}
		if err != nil {
			return nil, readError(err)
		}
		key, err = load(keyPEM)
		if errors.Is(err, ErrInvalidKey) {
			return nil, &loadError{
				msg: fmt.Sprintf("the node key %s is corrupt (%v); %s", keyPath, err, wayBack),
				err: err,
			}
		}
		if err != nil {
			return nil, fmt.Errorf("load the node key %s: %w", keyPath, err)
		}
	}
	if !samePublic(key.Public(), leaf.PublicKey) {
		CloseSigner(key)
		msg := ErrKeyMismatch.Error() + "; " + wayBack
		if isTPMRecord(keyPEM) {
			msg += "; " + tpmHint
		}
		return nil, &loadError{msg: msg, err: ErrKeyMismatch}
	}

	return &State{
		Dir:      dir,
		Identity: id,
		Leaf:     leaf,
		Chain:    chain,
		Roots:    roots,
		Key:      key,
	}, nil
}

// removeNext removes a node.key.next that does not belong to the identity.
func removeNext(path string) error {
	if err := atomicfile.Remove(path); err != nil {
		return fmt.Errorf("remove the stale next node key %s: %w", path, err)
	}
	return nil
}

// samePublic reports whether a and b are the same public key.
func samePublic(a, b crypto.PublicKey) bool {
	eq, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && eq.Equal(b)
}

// CloseSigner releases a signer that holds a resource (a TPM key): it calls
// Close, ignoring its error, when s implements io.Closer, and does nothing
// otherwise. LoadState and ReadKey release with it the signers they discard.
func CloseSigner(s crypto.Signer) {
	if c, ok := s.(io.Closer); ok {
		_ = c.Close()
	}
}

// isTPMRecord reports whether keyPEM is the record of a TPM-held key.
func isTPMRecord(keyPEM []byte) bool {
	block, _ := pem.Decode(keyPEM)
	return block != nil && block.Type == PEMTypeTPMKey
}
