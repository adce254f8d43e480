package pki

import (
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

// The files [Init] writes, relative to its directory. Names use '/'; join
// them with filepath.Join(dir, filepath.FromSlash(name)) or [Path].
const (
	RootCACertFile        = "root-ca.crt"
	RootCAKeyFile         = "root-ca.key"
	NodeCACertFile        = "node-ca.crt"
	NodeCAKeyFile         = "node-ca.key"
	DevIDCACertFile       = "devid-ca.crt"
	DevIDCAKeyFile        = "devid-ca.key"
	ServingCACertFile     = "serving-ca.crt"
	ServingCAKeyFile      = "serving-ca.key"
	ServingCertFile       = "serving.crt"
	ServingKeyFile        = "serving.key"
	JoinSigningKeyFile    = "join-signing.key"
	JoinEncryptionKeyFile = "join-encryption.key"
	JoinEncryptionJWKFile = "join-encryption.jwk"
	AdminCACertFile       = "admin-ca.crt"
	AdminCAKeyFile        = "admin-ca.key"
	AdminDir              = "admin"
	OwnerCertFile         = "admin/owner.crt"
	OwnerKeyFile          = "admin/owner.key"
	BundleFile            = "pki-bundle.json"
)

// InitFiles lists every file [Init] writes when every key is a file, in
// the order it writes them; BundleFile comes last, so its presence marks a
// complete directory. A key made by one of [InitOptions.ExternalKeys] has
// its [KeyUse.RefFile] in place of its key file.
var InitFiles = []string{
	RootCAKeyFile, RootCACertFile,
	NodeCAKeyFile, NodeCACertFile,
	DevIDCAKeyFile, DevIDCACertFile,
	ServingCAKeyFile, ServingCACertFile,
	ServingKeyFile, ServingCertFile,
	JoinSigningKeyFile,
	JoinEncryptionKeyFile, JoinEncryptionJWKFile,
	AdminCACertFile, AdminCAKeyFile,
	OwnerKeyFile, OwnerCertFile,
	BundleFile,
}

// OwnerName is the admin name of the owner credential [Init] makes; its
// certificate names spiffe://<trust-domain>/admin/owner.
const OwnerName = "owner"

// What Init makes, and limits on its options.
const (
	rootLifetimeYears    = 10
	caLifetimeYears      = 5
	leafLifetimeYears    = 1
	initBackdate         = 5 * time.Minute
	dirMode              = 0o700
	defaultServerName    = "localhost"
	maxServerNameLen     = 253
	maxServerNameLabel   = 63
	initCertSubjectLabel = "nodetrust"
)

// Path returns the path of one of Init's files (a name constant) in dir.
func Path(dir, name string) string {
	return filepath.Join(dir, filepath.FromSlash(name))
}

// InitOptions configures [Init].
type InitOptions struct {
	// TrustDomain must pass [ValidTrustDomain].
	TrustDomain string
	// ServerName is the DNS name in the serving certificate, which also
	// names "localhost"; empty means "localhost".
	ServerName string
	// ServerIPs are the serving certificate's IP SANs; nil means 127.0.0.1
	// and ::1.
	ServerIPs []net.IP
	// KEM is the join encryption KEM, [KEMP256] (also for "") or
	// [KEMMLKEM768P256].
	KEM string
	// Now is the issuing time; zero means time.Now(). Certificates are
	// valid from 5 minutes before it, to absorb clock skew.
	Now time.Time
	// ExternalKeys makes the keys of the uses it names outside a file (in
	// a PKCS#11 token, say); Init writes their references instead of key
	// files. Every other key is a PKCS#8 file.
	ExternalKeys map[KeyUse]KeyGenerator
}

// initFile is one file Init writes.
type initFile struct {
	name string
	data []byte
	mode os.FileMode
}

// Init creates the control plane's PKI in dir, creating dir (mode 0700)
// when it is missing: a root CA (10 years), a node-issuing CA (5 years,
// path length 0), a DevID CA for device identities (5 years, path length
// 0), a serving CA (5 years, path length 0), a serving
// certificate for ServerName, "localhost" and ServerIPs (1 year, chain
// included), the JoinService signing key (P-256), the join encryption key
// and its JWK, an admin CA (5 years, path length 0), the owner admin credential (a client certificate from the admin CA
// for spiffe://<td>/admin/owner with role owner, 1 year), and pki-bundle.json
// with the three pins. Private keys are PKCS#8 PEM, mode 0600, except
// those [InitOptions.ExternalKeys] makes, whose references are written to
// <use>.keyref; the other files are mode 0644.
//
// Init refuses with an error wrapping [ErrExists], naming the file, when
// any of its files (or a reference file) exists; it checks all of them
// before it makes any key, and creates each with O_EXCL. If it fails after
// making keys, Init removes the files it wrote and discards the external
// keys it made.
func Init(dir string, o InitOptions) (*Bundle, error) {
	if err := ValidTrustDomain(o.TrustDomain); err != nil {
		return nil, fmt.Errorf("init pki: %w", err)
	}
	if o.ServerName == "" {
		o.ServerName = defaultServerName
	}
	if err := validServerName(o.ServerName); err != nil {
		return nil, fmt.Errorf("init pki: %w", err)
	}
	if o.ServerIPs == nil {
		o.ServerIPs = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	for _, ip := range o.ServerIPs {
		if len(ip) != net.IPv4len && len(ip) != net.IPv6len {
			return nil, fmt.Errorf("init pki: server IP %v is not an IP address", ip)
		}
	}
	if _, _, err := kemByName(o.KEM); err != nil {
		return nil, fmt.Errorf("init pki: %w", err)
	}
	if o.Now.IsZero() {
		o.Now = time.Now()
	}
	for use := range o.ExternalKeys {
		if _, err := ParseKeyUse(string(use)); err != nil {
			return nil, fmt.Errorf("init pki: external keys: %w", err)
		}
	}
	if err := checkInitDir(dir); err != nil {
		return nil, err
	}
	files, external, bundle, err := makeInitFiles(o)
	discard := func() {
		for _, k := range external {
			if k.Discard != nil {
				_ = k.Discard()
			}
		}
	}
	if err != nil {
		discard()
		return nil, fmt.Errorf("init pki: %w", err)
	}
	if err := writeInitFiles(dir, files); err != nil {
		discard()
		return nil, err
	}
	return bundle, nil
}

// writeInitFiles writes Init's files into dir, or none of them.
func writeInitFiles(dir string, files []initFile) error {
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return fmt.Errorf("init pki: create directory: %w", err)
	}
	if err := os.Mkdir(Path(dir, AdminDir), dirMode); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("init pki: create directory: %w", err)
	}
	var written []string
	for _, f := range files {
		p := Path(dir, f.name)
		if err := writeNewFile(p, f.data, f.mode); err != nil {
			for _, w := range written {
				os.Remove(w)
			}
			if errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("init pki: %s: %w; choose another --dir or remove it", p, ErrExists)
			}
			return fmt.Errorf("init pki: write %s: %w", f.name, err)
		}
		written = append(written, p)
	}
	if err := syncDir(dir); err != nil {
		for _, w := range written {
			os.Remove(w)
		}
		return fmt.Errorf("init pki: %w", err)
	}
	return nil
}

// checkInitDir refuses when dir is not a directory or any Init file exists.
func checkInitDir(dir string) error {
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("init pki: %w", err)
	case !st.IsDir():
		return fmt.Errorf("init pki: %s is not a directory", dir)
	}
	names := slices.Clone(InitFiles)
	for _, u := range KeyUses {
		names = append(names, u.RefFile())
	}
	for _, name := range names {
		p := Path(dir, name)
		_, err := os.Lstat(p)
		if err == nil {
			return fmt.Errorf("init pki: %s: %w; choose another --dir or remove it", p, ErrExists)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("init pki: %w", err)
		}
	}
	return nil
}

// makeInitFiles makes every key and certificate in memory, and the keys
// of o.ExternalKeys where they live. It returns the external keys it made
// even when it fails, so that Init can discard them.
func makeInitFiles(o InitOptions) (files []initFile, external []*ExternalKey, bundle *Bundle, err error) {
	td := o.TrustDomain
	notBefore := o.Now.Add(-initBackdate)
	addCerts := func(name string, certs ...*x509.Certificate) {
		files = append(files, initFile{name, EncodeCertsPEM(certs...), PublicFileMode})
	}
	// newKey makes the key of use: in its generator, or as a file.
	newKey := func(use KeyUse) (crypto.Signer, error) {
		if gen := o.ExternalKeys[use]; gen != nil {
			k, err := gen(use)
			if err != nil {
				return nil, fmt.Errorf("%s key: %w", use.Description(), err)
			}
			if k == nil || k.Signer == nil {
				return nil, fmt.Errorf("%s key: the generator returned no key", use.Description())
			}
			external = append(external, k)
			if !isP256(k.Signer.Public()) {
				return nil, fmt.Errorf("%s key: key is %T, want ECDSA P-256", use.Description(), k.Signer.Public())
			}
			if err := checkKeyRef(k.Ref); err != nil {
				return nil, fmt.Errorf("%s key: %w", use.Description(), err)
			}
			files = append(files, initFile{use.RefFile(), []byte(k.Ref + "\n"), PublicFileMode})
			return k.Signer, nil
		}
		k, err := GenerateKey()
		if err != nil {
			return nil, err
		}
		b, err := MarshalPrivateKeyPEM(k)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", use.KeyFile(), err)
		}
		files = append(files, initFile{use.KeyFile(), b, PrivateKeyMode})
		return k, nil
	}
	// addFileKey adds a key that is always a file (the owner's).
	addFileKey := func(name string, key crypto.Signer) error {
		b, err := MarshalPrivateKeyPEM(key)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		files = append(files, initFile{name, b, PrivateKeyMode})
		return nil
	}

	rootKey, err := newKey(KeyRootCA)
	if err != nil {
		return nil, external, nil, err
	}
	root, err := createCert(&x509.Certificate{
		Subject:               pkix.Name{CommonName: initCertSubjectLabel + " root CA", Organization: []string{td}},
		NotBefore:             notBefore,
		NotAfter:              o.Now.AddDate(rootLifetimeYears, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            1,
	}, nil, rootKey.Public(), rootKey)
	if err != nil {
		return nil, external, nil, fmt.Errorf("root CA: %w", err)
	}
	addCerts(RootCACertFile, root)

	subCA := func(use KeyUse, certFile string) (*x509.Certificate, crypto.Signer, error) {
		key, err := newKey(use)
		if err != nil {
			return nil, nil, err
		}
		label := use.Description()
		c, err := createCert(&x509.Certificate{
			Subject:               pkix.Name{CommonName: initCertSubjectLabel + " " + label, Organization: []string{td}},
			NotBefore:             notBefore,
			NotAfter:              o.Now.AddDate(caLifetimeYears, 0, 0),
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
			BasicConstraintsValid: true,
			IsCA:                  true,
			MaxPathLenZero:        true,
		}, root, key.Public(), rootKey)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %w", label, err)
		}
		addCerts(certFile, c)
		return c, key, nil
	}
	if _, _, err := subCA(KeyNodeCA, NodeCACertFile); err != nil {
		return nil, external, nil, err
	}
	if _, _, err := subCA(KeyDevIDCA, DevIDCACertFile); err != nil {
		return nil, external, nil, err
	}
	servingCA, servingCAKey, err := subCA(KeyServingCA, ServingCACertFile)
	if err != nil {
		return nil, external, nil, err
	}

	servingKey, err := newKey(KeyServing)
	if err != nil {
		return nil, external, nil, err
	}
	dns := []string{o.ServerName}
	if o.ServerName != defaultServerName {
		dns = append(dns, defaultServerName)
	}
	serving, err := createCert(&x509.Certificate{
		Subject:               pkix.Name{CommonName: o.ServerName, Organization: []string{td}},
		NotBefore:             notBefore,
		NotAfter:              o.Now.AddDate(leafLifetimeYears, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              dns,
		IPAddresses:           o.ServerIPs,
	}, servingCA, servingKey.Public(), servingCAKey)
	if err != nil {
		return nil, external, nil, fmt.Errorf("serving certificate: %w", err)
	}
	addCerts(ServingCertFile, serving, servingCA)

	joinKey, err := newKey(KeyJoinSigning)
	if err != nil {
		return nil, external, nil, err
	}
	joinSigningPin, err := PinOf(joinKey.Public())
	if err != nil {
		return nil, external, nil, err
	}

	enc, err := GenerateJoinEncryptionKey(o.KEM)
	if err != nil {
		return nil, external, nil, err
	}
	encPEM, err := enc.MarshalPEM()
	if err != nil {
		return nil, external, nil, err
	}
	jwk, err := enc.Public().MarshalJWK()
	if err != nil {
		return nil, external, nil, err
	}
	files = append(files,
		initFile{JoinEncryptionKeyFile, encPEM, PrivateKeyMode},
		initFile{JoinEncryptionJWKFile, append(jwk, '\n'), PublicFileMode})

	adminCA, adminCAKey, err := subCA(KeyAdminCA, AdminCACertFile)
	if err != nil {
		return nil, external, nil, err
	}
	ownerKey, err := GenerateKey()
	if err != nil {
		return nil, external, nil, err
	}
	owner, err := IssueAdminCert(adminCA, adminCAKey, AdminCertRequest{
		PublicKey: ownerKey.Public(), TrustDomain: td, Name: OwnerName, Role: OwnerRole,
		NotBefore: notBefore, NotAfter: o.Now.AddDate(leafLifetimeYears, 0, 0),
	})
	if err != nil {
		return nil, external, nil, fmt.Errorf("owner credential: %w", err)
	}
	if err := addFileKey(OwnerKeyFile, ownerKey); err != nil {
		return nil, external, nil, err
	}
	addCerts(OwnerCertFile, owner, adminCA)

	bundle = &Bundle{
		TrustDomain:          td,
		ServerName:           o.ServerName,
		ServingCASPKIPin:     PinOfCert(servingCA),
		JoinSigningKeyPin:    joinSigningPin,
		JoinEncryptionKeyPin: enc.Public().Pin(),
	}
	b, err := json.MarshalIndent(bundle, "", "  ")
	if err != nil {
		return nil, external, nil, fmt.Errorf("bundle: %w", err)
	}
	files = append(files, initFile{BundleFile, append(b, '\n'), PublicFileMode})
	return files, external, bundle, nil
}

// createCert signs tmpl with a random serial; a nil parent self-signs.
func createCert(tmpl, parent *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) (*x509.Certificate, error) {
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}

// validServerName checks a DNS host name for the serving certificate.
func validServerName(s string) error {
	if net.ParseIP(s) != nil {
		return fmt.Errorf("server name %q is an IP address; list it in the server IPs instead", s)
	}
	if len(s) > maxServerNameLen {
		return fmt.Errorf("server name is %d characters, more than %d", len(s), maxServerNameLen)
	}
	label := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '.':
			if label == 0 {
				return fmt.Errorf("server name %q has an empty label", s)
			}
			if s[i-1] == '-' {
				return fmt.Errorf("server name %q has a label ending in '-'", s)
			}
			label = 0
			continue
		case c == '-':
			if label == 0 {
				return fmt.Errorf("server name %q has a label starting with '-'", s)
			}
		case isLowerAlnum(c), c >= 'A' && c <= 'Z':
		default:
			return fmt.Errorf("server name %q: character %q is not allowed in a DNS name", s, c)
		}
		label++
		if label > maxServerNameLabel {
			return fmt.Errorf("server name %q has a label longer than %d", s, maxServerNameLabel)
		}
	}
	if label == 0 {
		return fmt.Errorf("server name %q has an empty label", s)
	}
	if s[len(s)-1] == '-' {
		return fmt.Errorf("server name %q has a label ending in '-'", s)
	}
	return nil
}

// writeNewFile creates path with O_EXCL and exactly mode, writes data and
// syncs it.
func writeNewFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	// Chmod so the umask does not change the documented mode.
	if err := f.Chmod(mode); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// syncDir flushes dir's entries (and its admin subdirectory's) to disk.
func syncDir(dir string) error {
	for _, d := range []string{Path(dir, AdminDir), dir} {
		f, err := os.Open(d)
		if err != nil {
			return err
		}
		err = f.Sync()
		f.Close()
		if err != nil {
			return fmt.Errorf("sync %s: %w", d, err)
		}
	}
	return nil
}
