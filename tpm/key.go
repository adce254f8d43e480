package tpm

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/asn1"
	"errors"
	"fmt"
	"io"
	"math/big"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
)

// object is a key this package keeps loaded in the TPM until its Close.
type object struct {
	tpm        *TPM
	kind       KeyKind
	handle     tpm2.TPMHandle
	name       []byte
	publicArea []byte
	pub        *ecdsa.PublicKey
	record     KeyRecord
	closed     bool // guarded by tpm.mu
}

func (k KeyKind) what() string {
	if k == KindAK {
		return "the AK"
	}
	return "the node key"
}

func (k KeyKind) template(unique []byte) tpm2.TPMTPublic {
	if k == KindAK {
		return akTemplate(unique)
	}
	return nodeKeyTemplate(unique)
}

// flushObject unloads o. The caller holds t.mu.
func (t *TPM) flushObject(o *object) error {
	if o.closed {
		return nil
	}
	o.closed = true
	delete(t.loaded, o)
	return t.flush(o.handle, o.kind.what())
}

func (o *object) close() error {
	o.tpm.mu.Lock()
	defer o.tpm.mu.Unlock()
	if o.tpm.closed {
		return nil // TPM.Close flushed it
	}
	return o.tpm.flushObject(o)
}

// use locks the TPM for a command on o and returns the context's transport.
// The caller must call t.mu.Unlock.
func (t *TPM) use(ctx context.Context, objs ...*object) (transport.TPM, error) {
	tr, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	for _, o := range objs {
		if o == nil {
			t.mu.Unlock()
			return nil, errors.New("tpm: nil key")
		}
		if o.tpm != t {
			t.mu.Unlock()
			return nil, fmt.Errorf("tpm: %s was loaded in another TPM connection", o.kind.what())
		}
		if o.closed {
			t.mu.Unlock()
			return nil, fmt.Errorf("%s: %w", o.kind.what(), ErrClosed)
		}
	}
	return tr, nil
}

// newRecord makes a record of kind with a fresh random unique under the
// owner hierarchy.
func newRecord(kind KeyKind) (KeyRecord, error) {
	unique := make([]byte, UniqueSize)
	if _, err := rand.Read(unique); err != nil {
		return KeyRecord{}, fmt.Errorf("random unique for %s: %w", kind.what(), err)
	}
	return KeyRecord{
		Kind:      kind,
		Hierarchy: uint32(tpm2.TPMRHOwner),
		Template:  tpm2.Marshal(kind.template(unique)),
	}, nil
}

// load derives rec with TPM2_CreatePrimary (Part 3, section 24.1) and keeps
// the key loaded. It checks that the TPM's answer has the attributes of
// rec.Kind and, when the record names a key, that it is that key.
func (t *TPM) load(ctx context.Context, rec KeyRecord, kind KeyKind) (*object, error) {
	if rec.Kind != kind {
		return nil, fmt.Errorf("load %s: the record is of a %s", kind.what(), rec.Kind)
	}
	if err := rec.validate(); err != nil {
		return nil, fmt.Errorf("load %s: %w", kind.what(), err)
	}
	tr, err := t.begin(ctx)
	if err != nil {
		return nil, err
	}
	defer t.mu.Unlock()
	lo, err := t.createPrimary(tr, tpm2.TPMHandle(rec.Hierarchy), rec.Template, kind.what())
	if err != nil {
		return nil, err
	}
	pub, err := checkPublicArea(lo.publicArea, kind.template(nil))
	if err != nil {
		err = fmt.Errorf("TPM2_CreatePrimary for %s: the TPM's answer: %w", kind.what(), err)
	} else if len(rec.Name) != 0 && !bytes.Equal(rec.Name, lo.name) {
		err = fmt.Errorf("TPM2_CreatePrimary for %s: name %x, the record's %x: %w", kind.what(), lo.name, rec.Name, ErrKeyChanged)
	}
	if err != nil {
		return nil, errors.Join(err, t.flush(lo.handle, kind.what()))
	}
	rec.Name = lo.name
	o := &object{
		tpm:        t,
		kind:       kind,
		handle:     lo.handle,
		name:       lo.name,
		publicArea: lo.publicArea,
		pub:        pub,
		record:     rec,
	}
	t.loaded[o] = struct{}{}
	return o, nil
}

// Key is the node key, held in the TPM: an ECDSA P-256 crypto.Signer. It
// stays loaded (one transient object) until Close.
type Key struct{ o *object }

var (
	_ crypto.Signer = (*Key)(nil)
	_ io.Closer     = (*Key)(nil)
)

// NewNodeKey makes a new node key: a fresh [KeyRecord] with 32 random bytes
// in its template's unique field, derived under the owner hierarchy with
// TPM2_CreatePrimary (Part 3, section 24.1). Store the record (node.key, via
// [MarshalKeyRecord]) to load the same key later with [TPM.LoadNodeKey].
func (t *TPM) NewNodeKey(ctx context.Context) (*Key, KeyRecord, error) {
	rec, err := newRecord(KindNodeKey)
	if err != nil {
		return nil, KeyRecord{}, err
	}
	o, err := t.load(ctx, rec, KindNodeKey)
	if err != nil {
		return nil, KeyRecord{}, err
	}
	return &Key{o}, o.record, nil
}

// LoadNodeKey derives the node key of rec again. When rec names a key and the
// TPM derives another (its owner hierarchy was cleared, or it is another
// TPM), the error wraps [ErrKeyChanged].
func (t *TPM) LoadNodeKey(ctx context.Context, rec KeyRecord) (*Key, error) {
	o, err := t.load(ctx, rec, KindNodeKey)
	if err != nil {
		return nil, err
	}
	return &Key{o}, nil
}

// Public returns the key's *ecdsa.PublicKey.
func (k *Key) Public() crypto.PublicKey { return k.o.pub }

// Name returns the key's TPM name (Part 1, section 16): the nameAlg
// (TPM_ALG_SHA256) followed by the SHA-256 of its public area.
func (k *Key) Name() []byte { return bytes.Clone(k.o.name) }

// PublicArea returns the key's TPMT_PUBLIC, the contents of the TPM2B_PUBLIC
// (Part 2, section 12.2.5) that TPM2_CreatePrimary returned.
func (k *Key) PublicArea() []byte { return bytes.Clone(k.o.publicArea) }

// Record returns the record the key was derived from, naming this key.
func (k *Key) Record() KeyRecord { return k.o.record }

// Close unloads the key (TPM2_FlushContext). Closing twice is a no-op.
func (k *Key) Close() error { return k.o.close() }

// Sign signs digest, a SHA-256 digest (opts.HashFunc() must be
// crypto.SHA256), with TPM2_Sign (Part 3, section 20.2) and returns an
// ASN.1 DER ECDSA signature as ecdsa.PrivateKey.Sign does, so crypto/x509 and
// crypto/tls accept the key. rand is not used: the TPM makes the nonce.
func (k *Key) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if opts == nil || opts.HashFunc() != crypto.SHA256 {
		return nil, errors.New("tpm: the node key signs SHA-256 digests only")
	}
	return k.SignContext(context.Background(), digest)
}

// SignContext is [Key.Sign] with a context, for a caller with a deadline.
func (k *Key) SignContext(ctx context.Context, digest []byte) ([]byte, error) {
	if len(digest) != 32 {
		return nil, fmt.Errorf("tpm: digest of %d bytes, want a SHA-256 digest", len(digest))
	}
	t := k.o.tpm
	tr, err := t.use(ctx, k.o)
	if err != nil {
		return nil, err
	}
	defer t.mu.Unlock()
	rsp, err := tpm2.Sign{
		KeyHandle: tpm2.AuthHandle{Handle: k.o.handle, Name: tpm2.TPM2BName{Buffer: k.o.name}, Auth: tpm2.PasswordAuth(nil)},
		Digest:    tpm2.TPM2BDigest{Buffer: digest},
		InScheme: tpm2.TPMTSigScheme{
			Scheme:  tpm2.TPMAlgECDSA,
			Details: tpm2.NewTPMUSigScheme(tpm2.TPMAlgECDSA, &tpm2.TPMSSchemeHash{HashAlg: tpm2.TPMAlgSHA256}),
		},
		// An unrestricted key needs no proof that the TPM made the digest:
		// a NULL ticket (Part 2, section 10.7.6).
		Validation: tpm2.TPMTTKHashCheck{Tag: tpm2.TPMSTHashCheck, Hierarchy: tpm2.TPMRHNull},
	}.Execute(tr)
	if err != nil {
		return nil, fmt.Errorf("TPM2_Sign with the node key: %w", err)
	}
	sig, err := rsp.Signature.Signature.ECDSA()
	if err != nil {
		return nil, fmt.Errorf("TPM2_Sign with the node key: signature: %w", err)
	}
	der, err := asn1.Marshal(struct{ R, S *big.Int }{
		new(big.Int).SetBytes(sig.SignatureR.Buffer),
		new(big.Int).SetBytes(sig.SignatureS.Buffer),
	})
	if err != nil {
		return nil, fmt.Errorf("TPM2_Sign with the node key: encode signature: %w", err)
	}
	return der, nil
}

// AK is an attestation key held in the TPM: a restricted ECDSA P-256 signing
// key under the owner hierarchy, which signs only what the TPM itself
// produces (quotes, certifications). It stays loaded until Close.
//
// The AK lives under the owner hierarchy, like the node key: clearing the
// owner hierarchy (a new owner) ends both, and the node must attest again
// with its EK. The EK links the AK to the TPM through credential activation,
// not through the hierarchy.
type AK struct{ o *object }

var _ io.Closer = (*AK)(nil)

// NewAK makes a new AK from a fresh [KeyRecord], as [TPM.NewNodeKey] does
// for the node key.
func (t *TPM) NewAK(ctx context.Context) (*AK, KeyRecord, error) {
	rec, err := newRecord(KindAK)
	if err != nil {
		return nil, KeyRecord{}, err
	}
	o, err := t.load(ctx, rec, KindAK)
	if err != nil {
		return nil, KeyRecord{}, err
	}
	return &AK{o}, o.record, nil
}

// LoadAK derives the AK of rec again; see [TPM.LoadNodeKey].
func (t *TPM) LoadAK(ctx context.Context, rec KeyRecord) (*AK, error) {
	o, err := t.load(ctx, rec, KindAK)
	if err != nil {
		return nil, err
	}
	return &AK{o}, nil
}

// Public returns the AK's *ecdsa.PublicKey.
func (a *AK) Public() crypto.PublicKey { return a.o.pub }

// Name returns the AK's TPM name (Part 1, section 16), which credential
// activation binds the credential to.
func (a *AK) Name() []byte { return bytes.Clone(a.o.name) }

// PublicArea returns the AK's TPMT_PUBLIC (contents of a TPM2B_PUBLIC).
func (a *AK) PublicArea() []byte { return bytes.Clone(a.o.publicArea) }

// Record returns the record the AK was derived from, naming this AK.
func (a *AK) Record() KeyRecord { return a.o.record }

// Close unloads the AK (TPM2_FlushContext). Closing twice is a no-op.
func (a *AK) Close() error { return a.o.close() }

// NodeKey is a node key held in a TPM: a *Key of this package, or one held
// through another process that owns the TPM (bcd helper's client). Close
// unloads it.
type NodeKey interface {
	crypto.Signer
	io.Closer
	// SignContext signs a SHA-256 digest, honouring ctx.
	SignContext(ctx context.Context, digest []byte) ([]byte, error)
	// Name is the key's TPM name (Part 1, section 16).
	Name() []byte
	// PublicArea is the key's TPMT_PUBLIC.
	PublicArea() []byte
	// Record is what derives the key again.
	Record() KeyRecord
}

// AttestationKey is an AK held in a TPM: an *AK of this package, or one
// held through another process that owns the TPM. Close unloads it.
type AttestationKey interface {
	io.Closer
	Public() crypto.PublicKey
	Name() []byte
	PublicArea() []byte
	Record() KeyRecord
}

var (
	_ NodeKey        = (*Key)(nil)
	_ AttestationKey = (*AK)(nil)
)
