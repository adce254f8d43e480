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
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// The files [Init] writes, relative to its directory. Names use '/'; join
// them with filepath.Join(dir, filepath.FromSlash(name)) or [Path].
const (
	RootCACertFile        = "root-ca.crt"
	RootCAKeyFile         = "root-ca.key"
	NodeCACertFile        = "node-ca.crt"
	NodeCAKeyFile         = "node-ca.key"
	ServingCACertFile     = "serving-ca.crt"
	ServingCAKeyFile      = "serving-ca.key"
	ServingCertFile       = "serving.crt"
	ServingKeyFile        = "serving.key"
	JoinSigningKeyFile    = "join-signing.key"
	JoinEncryptionKeyFile = "join-encryption.key"
	JoinEncryptionJWKFile = "join-encryption.jwk"
	AdminDir              = "admin"
	OwnerCertFile         = "admin/owner.crt"
	OwnerKeyFile          = "admin/owner.key"
	BundleFile            = "pki-bundle.json"
)

// InitFiles lists every file [Init] writes, in the order it writes them;
// BundleFile comes last, so its presence marks a complete directory.
var InitFiles = []string{
	RootCACertFile, RootCAKeyFile,
	NodeCACertFile, NodeCAKeyFile,
	ServingCACertFile, ServingCAKeyFile,
	ServingCertFile, ServingKeyFile,
	JoinSigningKeyFile,
	JoinEncryptionKeyFile, JoinEncryptionJWKFile,
	OwnerCertFile, OwnerKeyFile,
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
}

// initFile is one file Init writes.
type initFile struct {
	name string
	data []byte
	mode os.FileMode
}

// Init creates the control plane's PKI in dir, creating dir (mode 0700)
// when it is missing: a root CA (10 years), a node-issuing CA (5 years,
// path length 0), a serving CA (5 years, path length 0), a serving
// certificate for ServerName, "localhost" and ServerIPs (1 year, chain
// included), the JoinService signing key (P-256), the join encryption key
// and its JWK, the owner admin credential (a client certificate from the
// serving CA for spiffe://<td>/admin/owner, 1 year), and pki-bundle.json
// with the three pins. Private keys are PKCS#8 PEM, mode 0600; the other
// files are mode 0644.
//
// Init refuses with an error wrapping [ErrExists], naming the file, when
// any of its files exists; it checks all of them before it writes any, and
// creates each with O_EXCL. If a write fails, Init removes the files it
// wrote.
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
	if err := checkInitDir(dir); err != nil {
		return nil, err
	}
	files, bundle, err := makeInitFiles(o)
	if err != nil {
		return nil, fmt.Errorf("init pki: %w", err)
	}
	if err := os.MkdirAll(dir, dirMode); err != nil {
		return nil, fmt.Errorf("init pki: create directory: %w", err)
	}
	if err := os.Mkdir(Path(dir, AdminDir), dirMode); err != nil && !errors.Is(err, fs.ErrExist) {
		return nil, fmt.Errorf("init pki: create directory: %w", err)
	}
	var written []string
	for _, f := range files {
		p := Path(dir, f.name)
		if err := writeNewFile(p, f.data, f.mode); err != nil {
			for _, w := range written {
				os.Remove(w)
			}
			if errors.Is(err, fs.ErrExist) {
				return nil, fmt.Errorf("init pki: %s: %w; choose another --dir or remove it", p, ErrExists)
			}
			return nil, fmt.Errorf("init pki: write %s: %w", f.name, err)
		}
		written = append(written, p)
	}
	if err := syncDir(dir); err != nil {
		return nil, fmt.Errorf("init pki: %w", err)
	}
	return bundle, nil
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
	for _, name := range InitFiles {
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

// makeInitFiles makes every key and certificate in memory.
func makeInitFiles(o InitOptions) ([]initFile, *Bundle, error) {
	td := o.TrustDomain
	notBefore := o.Now.Add(-initBackdate)
	var files []initFile
	addKey := func(name string, key crypto.Signer) error {
		b, err := MarshalPrivateKeyPEM(key)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		files = append(files, initFile{name, b, PrivateKeyMode})
		return nil
	}
	addCerts := func(name string, certs ...*x509.Certificate) {
		files = append(files, initFile{name, EncodeCertsPEM(certs...), PublicFileMode})
	}

	rootKey, err := GenerateKey()
	if err != nil {
		return nil, nil, err
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
		return nil, nil, fmt.Errorf("root CA: %w", err)
	}
	addCerts(RootCACertFile, root)
	if err := addKey(RootCAKeyFile, rootKey); err != nil {
		return nil, nil, err
	}

	subCA := func(label string) (*x509.Certificate, crypto.Signer, error) {
		key, err := GenerateKey()
		if err != nil {
			return nil, nil, err
		}
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
		return c, key, nil
	}
	nodeCA, nodeKey, err := subCA("node CA")
	if err != nil {
		return nil, nil, err
	}
	addCerts(NodeCACertFile, nodeCA)
	if err := addKey(NodeCAKeyFile, nodeKey); err != nil {
		return nil, nil, err
	}
	servingCA, servingCAKey, err := subCA("serving CA")
	if err != nil {
		return nil, nil, err
	}
	addCerts(ServingCACertFile, servingCA)
	if err := addKey(ServingCAKeyFile, servingCAKey); err != nil {
		return nil, nil, err
	}

	servingKey, err := GenerateKey()
	if err != nil {
		return nil, nil, err
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
		return nil, nil, fmt.Errorf("serving certificate: %w", err)
	}
	addCerts(ServingCertFile, serving, servingCA)
	if err := addKey(ServingKeyFile, servingKey); err != nil {
		return nil, nil, err
	}

	joinKey, err := GenerateKey()
	if err != nil {
		return nil, nil, err
	}
	if err := addKey(JoinSigningKeyFile, joinKey); err != nil {
		return nil, nil, err
	}
	joinSigningPin, err := PinOf(joinKey.Public())
	if err != nil {
		return nil, nil, err
	}

	enc, err := GenerateJoinEncryptionKey(o.KEM)
	if err != nil {
		return nil, nil, err
	}
	encPEM, err := enc.MarshalPEM()
	if err != nil {
		return nil, nil, err
	}
	jwk, err := enc.Public().MarshalJWK()
	if err != nil {
		return nil, nil, err
	}
	files = append(files,
		initFile{JoinEncryptionKeyFile, encPEM, PrivateKeyMode},
		initFile{JoinEncryptionJWKFile, append(jwk, '\n'), PublicFileMode})

	ownerKey, err := GenerateKey()
	if err != nil {
		return nil, nil, err
	}
	ownerID, err := AdminID(td, OwnerName)
	if err != nil {
		return nil, nil, fmt.Errorf("owner credential: %w", err)
	}
	owner, err := createCert(&x509.Certificate{
		Subject:               pkix.Name{CommonName: OwnerName, Organization: []string{td}},
		NotBefore:             notBefore,
		NotAfter:              o.Now.AddDate(leafLifetimeYears, 0, 0),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{ownerID.URL()},
	}, servingCA, ownerKey.Public(), servingCAKey)
	if err != nil {
		return nil, nil, fmt.Errorf("owner credential: %w", err)
	}
	addCerts(OwnerCertFile, owner, servingCA)
	if err := addKey(OwnerKeyFile, ownerKey); err != nil {
		return nil, nil, err
	}

	bundle := &Bundle{
		TrustDomain:          td,
		ServerName:           o.ServerName,
		ServingCASPKIPin:     PinOfCert(servingCA),
		JoinSigningKeyPin:    joinSigningPin,
		JoinEncryptionKeyPin: enc.Public().Pin(),
	}
	b, err := json.MarshalIndent(bundle, "", "  ")
	if err != nil {
		return nil, nil, fmt.Errorf("bundle: %w", err)
	}
	files = append(files, initFile{BundleFile, append(b, '\n'), PublicFileMode})
	return files, bundle, nil
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
