// Package ekroots reads and checks a TPM manufacturer root bundle: a folder
// of the vendors' CA certificates (roots and intermediates) that EK
// certificates chain to. `fleetd ek-roots check DIR` prints what it finds;
// fleetd serve loads the folder of [tpm] ek_roots_dir with it and refuses
// to start on any error (docs/attestor-tpm.md).
package ekroots

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Bounds on a bundle folder: vendors publish a few dozen certificates.
const (
	MaxFiles        = 1024
	MaxFileSize     = 256 << 10
	MaxCertsPerFile = 64
	// ExpiryWarning is how close to its end a certificate's validity
	// draws a warning.
	ExpiryWarning = 90 * 24 * time.Hour
)

// Kind is what a certificate of the bundle is.
type Kind string

const (
	// Root is a self-signed CA certificate: a trust anchor.
	Root Kind = "root"
	// Intermediate is a CA certificate issued by another CA: it builds
	// chains and is trusted only through a root.
	Intermediate Kind = "intermediate"
	// NotCA is a certificate that cannot issue others (an EK certificate
	// put there by mistake): an error.
	NotCA Kind = "not-a-ca"
)

// Entry is one certificate of the bundle.
type Entry struct {
	File     string            `json:"file"`
	Kind     Kind              `json:"kind"`
	Subject  string            `json:"subject"`
	Issuer   string            `json:"issuer"`
	SHA256   string            `json:"sha256"`
	NotAfter time.Time         `json:"not_after"`
	Cert     *x509.Certificate `json:"-"`
}

// Problem is something wrong with the bundle. An error makes the bundle
// unusable (fleetd serve does not start); a warning does not.
type Problem struct {
	File    string `json:"file"`
	Error   bool   `json:"error"`
	Message string `json:"message"`
}

// Bundle is a checked root bundle.
type Bundle struct {
	Dir      string    `json:"dir"`
	Entries  []Entry   `json:"certificates"`
	Problems []Problem `json:"problems,omitempty"`
	// Skipped are files that are not certificate files by name.
	Skipped []string `json:"skipped,omitempty"`
}

// HasErrors reports whether a problem is an error.
func (b *Bundle) HasErrors() bool {
	return slices.ContainsFunc(b.Problems, func(p Problem) bool { return p.Error })
}

// Errors joins the error problems, for a start that refuses the bundle.
func (b *Bundle) Errors() error {
	var errs []error
	for _, p := range b.Problems {
		if p.Error {
			errs = append(errs, fmt.Errorf("%s: %s", p.File, p.Message))
		}
	}
	return errors.Join(errs...)
}

// Roots returns a pool of the bundle's roots.
func (b *Bundle) Roots() *x509.CertPool { return b.pool(Root) }

// Intermediates returns a pool of the bundle's intermediates.
func (b *Bundle) Intermediates() *x509.CertPool { return b.pool(Intermediate) }

func (b *Bundle) pool(k Kind) *x509.CertPool {
	p := x509.NewCertPool()
	for _, e := range b.Entries {
		if e.Kind == k {
			p.AddCert(e.Cert)
		}
	}
	return p
}

// certExtensions are the names of certificate files a bundle holds; other
// files (a README, a checksum list) are skipped and listed.
var certExtensions = []string{".pem", ".crt", ".cer", ".der"}

// Load reads every certificate file of dir (not its subfolders) — PEM
// with one or more CERTIFICATE blocks, or one DER certificate — and
// checks the bundle at now: each certificate is a CA (a root when
// self-signed with a valid self-signature, else an intermediate); none has
// expired or is not yet valid (errors), none ends within [ExpiryWarning]
// (a warning); no certificate is in two files (a warning); every
// intermediate's issuer is in the bundle (a warning: the chain stops
// there). A folder that cannot be read or holds no certificate is an
// error returned as such.
func Load(dir string, now time.Time) (*Bundle, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read the EK root bundle: %w", err)
	}
	b := &Bundle{Dir: dir}
	files := 0
	for _, e := range ents {
		if e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		if !slices.Contains(certExtensions, strings.ToLower(filepath.Ext(e.Name()))) {
			b.Skipped = append(b.Skipped, e.Name())
			continue
		}
		if files++; files > MaxFiles {
			return nil, fmt.Errorf("the EK root bundle %s has more than %d certificate files", dir, MaxFiles)
		}
		certs, err := readCerts(filepath.Join(dir, e.Name()))
		if err != nil {
			b.Problems = append(b.Problems, Problem{File: e.Name(), Error: true, Message: err.Error()})
			continue
		}
		for _, c := range certs {
			b.Entries = append(b.Entries, entry(e.Name(), c))
		}
	}
	if len(b.Entries) == 0 && !b.HasErrors() {
		return nil, fmt.Errorf("the EK root bundle %s holds no certificate file (%s)", dir, strings.Join(certExtensions, ", "))
	}
	b.check(now)
	return b, nil
}

func entry(file string, c *x509.Certificate) Entry {
	sum := sha256.Sum256(c.Raw)
	e := Entry{File: file, Subject: c.Subject.String(), Issuer: c.Issuer.String(), SHA256: "sha256:" + hex.EncodeToString(sum[:]), NotAfter: c.NotAfter, Cert: c}
	switch {
	case !c.IsCA || !c.BasicConstraintsValid:
		e.Kind = NotCA
	case bytes.Equal(c.RawSubject, c.RawIssuer) && c.CheckSignatureFrom(c) == nil:
		e.Kind = Root
	default:
		e.Kind = Intermediate
	}
	return e
}

func (b *Bundle) check(now time.Time) {
	seen := map[string]string{}
	add := func(file string, isErr bool, format string, args ...any) {
		b.Problems = append(b.Problems, Problem{File: file, Error: isErr, Message: fmt.Sprintf(format, args...)})
	}
	for _, e := range b.Entries {
		c := e.Cert
		who := fmt.Sprintf("%q (%s)", e.Subject, e.SHA256)
		if other, dup := seen[e.SHA256]; dup {
			add(e.File, false, "%s is also in %s: keep one copy", who, other)
		} else {
			seen[e.SHA256] = e.File
		}
		switch {
		case e.Kind == NotCA:
			add(e.File, true, "%s is not a CA certificate (an EK certificate?): a root bundle holds only vendor CAs", who)
		case bytes.Equal(c.RawSubject, c.RawIssuer) && e.Kind == Intermediate:
			add(e.File, true, "%s names itself as issuer but its self-signature does not verify", who)
		}
		switch {
		case now.After(c.NotAfter):
			add(e.File, true, "%s expired on %s: nothing chains to it; remove it or get the vendor's current one", who, c.NotAfter.UTC().Format(time.DateOnly))
		case now.Before(c.NotBefore):
			add(e.File, true, "%s is not valid before %s", who, c.NotBefore.UTC().Format(time.DateOnly))
		case c.NotAfter.Sub(now) < ExpiryWarning:
			add(e.File, false, "%s expires on %s", who, c.NotAfter.UTC().Format(time.DateOnly))
		}
	}
	for _, e := range b.Entries {
		if e.Kind != Intermediate {
			continue
		}
		if !slices.ContainsFunc(b.Entries, func(o Entry) bool {
			return o.Kind != NotCA && o.SHA256 != e.SHA256 && e.Cert.CheckSignatureFrom(o.Cert) == nil
		}) {
			add(e.File, false, "intermediate %q: its issuer %q is not in the bundle, so chains through it reach no root; add the vendor's root", e.Subject, e.Issuer)
		}
	}
}

// readCerts reads one file: PEM CERTIFICATE blocks, or one DER
// certificate.
func readCerts(path string) ([]*x509.Certificate, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	raw, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(raw) > MaxFileSize {
		return nil, fmt.Errorf("more than %d bytes: not a certificate file", MaxFileSize)
	}
	if !bytes.Contains(raw, []byte("-----BEGIN")) {
		c, err := x509.ParseCertificate(raw)
		if err != nil {
			return nil, fmt.Errorf("neither PEM nor one DER certificate: %w", err)
		}
		return []*x509.Certificate{c}, nil
	}
	var out []*x509.Certificate
	for rest := raw; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if strings.Contains(blk.Type, "PRIVATE KEY") {
			return nil, fmt.Errorf("PEM block %d is a private key: it does not belong in a root bundle; move it out of this folder", len(out)+1)
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %d is %q, want CERTIFICATE", len(out)+1, blk.Type)
		}
		if len(out) == MaxCertsPerFile {
			return nil, fmt.Errorf("more than %d certificates in one file", MaxCertsPerFile)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("PEM block %d: %w", len(out)+1, err)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return out, nil
}
