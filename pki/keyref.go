package pki

import (
	"crypto"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
)

// KeyUse names one private key of the control plane's PKI. Each use can
// live in its own place: a PKCS#8 file in the PKI directory, or a key in
// hardware (a PKCS#11 token) that a reference file names.
type KeyUse string

// The keys [Init] makes. The join encryption key is not among them: it is
// always a file (see [JoinEncryptionKeyFile]).
const (
	KeyRootCA      KeyUse = "root-ca"
	KeyNodeCA      KeyUse = "node-ca"
	KeyDevIDCA     KeyUse = "devid-ca"
	KeyServingCA   KeyUse = "serving-ca"
	KeyServing     KeyUse = "serving"
	KeyJoinSigning KeyUse = "join-signing"
	KeyAdminCA     KeyUse = "admin-ca"
)

// KeyUses lists every [KeyUse], in the order [Init] makes the keys.
var KeyUses = []KeyUse{KeyRootCA, KeyNodeCA, KeyDevIDCA, KeyServingCA, KeyServing, KeyJoinSigning, KeyAdminCA}

// keyDescriptions name each use for people.
var keyDescriptions = map[KeyUse]string{
	KeyRootCA:      "root CA",
	KeyNodeCA:      "node CA",
	KeyDevIDCA:     "DevID CA",
	KeyServingCA:   "serving CA",
	KeyServing:     "serving (TLS)",
	KeyJoinSigning: "JoinService signing",
	KeyAdminCA:     "admin CA",
}

// ParseKeyUse parses the name of a use ("node-ca", …).
func ParseKeyUse(s string) (KeyUse, error) {
	u := KeyUse(s)
	if _, ok := keyDescriptions[u]; !ok {
		names := make([]string, len(KeyUses))
		for i, k := range KeyUses {
			names[i] = string(k)
		}
		return "", fmt.Errorf("key use %q is not one of %s", s, strings.Join(names, ", "))
	}
	return u, nil
}

// String returns the use's name.
func (u KeyUse) String() string { return string(u) }

// Description names the use for people: "node CA", "JoinService signing".
func (u KeyUse) Description() string {
	if d, ok := keyDescriptions[u]; ok {
		return d
	}
	return string(u)
}

// KeyFile is the name of the use's PKCS#8 file in the PKI directory.
func (u KeyUse) KeyFile() string { return string(u) + ".key" }

// RefFile is the name of the file that names the use's key when the key
// lives outside the PKI directory: one line, the key's reference (for a
// PKCS#11 token, its RFC 7512 URI). It holds no secret.
func (u KeyUse) RefFile() string { return string(u) + ".keyref" }

// ExternalKey is a key a [KeyGenerator] made outside a file.
type ExternalKey struct {
	// Signer signs with the key; its public key must be ECDSA P-256.
	Signer crypto.Signer
	// Ref names the key so that a [KeyOpener] finds it again; [Init]
	// writes it to the use's [KeyUse.RefFile]. It must be one line of
	// printable ASCII and hold no secret.
	Ref string
	// Discard, when not nil, removes the key again; [Init] calls it when
	// it fails after the key was made.
	Discard func() error
}

// KeyGenerator makes the key of one use outside a file, such as in a
// PKCS#11 token.
type KeyGenerator func(use KeyUse) (*ExternalKey, error)

// KeyOpener opens the key of one use from the reference its
// [KeyUse.RefFile] holds.
type KeyOpener func(use KeyUse, ref string) (crypto.Signer, error)

// ErrKeyUnavailable means a key that lives in a device (a PKCS#11 token)
// cannot sign now: the device is missing, unplugged or not answering.
// Signers of such keys wrap it in their errors; a caller may retry later.
var ErrKeyUnavailable = errors.New("key unavailable")

// ErrNoKey means a PKI directory holds neither a key file nor a reference
// for a key that is needed.
var ErrNoKey = errors.New("no key")

// KeyLocation says where one key of a PKI directory lives.
type KeyLocation struct {
	Use KeyUse
	// File is the key's PKCS#8 file when the key is a file.
	File string
	// Ref is the key's reference when it lives elsewhere.
	Ref string
}

// Where describes the location for people: "file <path>", the reference,
// or "not here" when the directory holds neither (a key kept offline).
func (l KeyLocation) Where() string {
	switch {
	case l.File != "":
		return "file " + l.File
	case l.Ref != "":
		return l.Ref
	}
	return "not here (kept offline, or never made)"
}

// maxKeyRefSize bounds a reference file.
const maxKeyRefSize = 4 << 10

// LocateKey reports where the key of use lives in dir. It refuses a
// directory that holds both a key file and a reference for one use.
func LocateKey(dir string, use KeyUse) (KeyLocation, error) {
	loc := KeyLocation{Use: use}
	keyPath := Path(dir, use.KeyFile())
	refPath := Path(dir, use.RefFile())
	_, keyErr := os.Lstat(keyPath)
	if keyErr != nil && !errors.Is(keyErr, fs.ErrNotExist) {
		return loc, fmt.Errorf("locate the %s key: %w", use.Description(), keyErr)
	}
	ref, refErr := ReadKeyRef(refPath)
	if refErr != nil && !errors.Is(refErr, fs.ErrNotExist) {
		return loc, fmt.Errorf("locate the %s key: %w", use.Description(), refErr)
	}
	switch {
	case keyErr == nil && refErr == nil:
		return loc, fmt.Errorf("locate the %s key: both %s and %s exist; remove the one that is not the key in use", use.Description(), keyPath, refPath)
	case keyErr == nil:
		loc.File = keyPath
	case refErr == nil:
		loc.Ref = ref
	}
	return loc, nil
}

// LocateKeys reports where each key of dir lives, in [KeyUses] order.
func LocateKeys(dir string) ([]KeyLocation, error) {
	out := make([]KeyLocation, 0, len(KeyUses))
	for _, u := range KeyUses {
		l, err := LocateKey(dir, u)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// ReadKeyRef reads a reference file: one line of at most 4 KiB of
// printable ASCII without spaces. Errors name the file and wrap
// fs.ErrNotExist when it is missing.
func ReadKeyRef(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("read key reference: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxKeyRefSize+1))
	if err != nil {
		return "", fmt.Errorf("read key reference %s: %w", path, err)
	}
	if len(b) > maxKeyRefSize {
		return "", fmt.Errorf("key reference %s is longer than %d bytes", path, maxKeyRefSize)
	}
	ref := strings.TrimSuffix(string(b), "\n")
	if err := checkKeyRef(ref); err != nil {
		return "", fmt.Errorf("key reference %s: %w", path, err)
	}
	return ref, nil
}

// checkKeyRef checks a reference before it is written or after it is read.
func checkKeyRef(ref string) error {
	if ref == "" {
		return errors.New("empty reference")
	}
	if len(ref) > maxKeyRefSize {
		return fmt.Errorf("reference is longer than %d bytes", maxKeyRefSize)
	}
	for i := 0; i < len(ref); i++ {
		if c := ref[i]; c <= ' ' || c >= 0x7f {
			return fmt.Errorf("reference holds byte %#x at %d: want one line of printable ASCII without spaces", c, i)
		}
	}
	return nil
}

// openKey opens the key of use in dir: its file, or through open when a
// reference names it. A nil open refuses references.
func openKey(dir string, use KeyUse, open KeyOpener) (crypto.Signer, error) {
	loc, err := LocateKey(dir, use)
	if err != nil {
		return nil, err
	}
	switch {
	case loc.File != "":
		return ReadPrivateKey(loc.File)
	case loc.Ref == "":
		return nil, fmt.Errorf("the %s key: %s and %s are missing: %w", use.Description(), Path(dir, use.KeyFile()), Path(dir, use.RefFile()), ErrNoKey)
	case open == nil:
		return nil, fmt.Errorf("the %s key lives outside a file (%s names %s) and this program cannot open it", use.Description(), Path(dir, use.RefFile()), loc.Ref)
	}
	key, err := open(use, loc.Ref)
	if err != nil {
		return nil, fmt.Errorf("open the %s key %s: %w", use.Description(), loc.Ref, err)
	}
	return key, nil
}
