package config

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/nodetrust/nodetrust/pki"
)

// DefaultBCDConfig and DefaultBCDDataDir are where bcd looks when no flag
// names another place.
const (
	DefaultBCDConfig  = "/etc/bcd/config.toml"
	DefaultBCDDataDir = "/var/lib/bcd"
	// JWKFile is the join encryption key, beside config.toml.
	JWKFile = "join-encryption.jwk"
)

// BCD is the node's config.toml. Pins are written by the install script
// from the control plane's pki-bundle.json.
type BCD struct {
	// Server is the control plane's gRPC address, host:port.
	Server string `toml:"server"`
	// ServerName is the name checked in the serving certificate; default:
	// the host part of Server.
	ServerName string `toml:"server_name"`
	DataDir    string `toml:"data_dir"`
	Role       string `toml:"role"`

	ServingCASPKIPin     string `toml:"serving_ca_spki_pin"`
	JoinSigningKeyPin    string `toml:"join_signing_key_pin"`
	JoinEncryptionKeyPin string `toml:"join_encryption_key_pin"`

	// TPM is "auto" (the default: /dev/tpmrm0 when present), "off", a
	// device path, or tcp://host:port (swtpm).
	TPM string `toml:"tpm"`

	Renewal Renewal `toml:"renewal"`

	// Parsed pins, filled by Validate.
	Pins Pins `toml:"-"`

	path string
}

// Renewal tunes when the agent renews; the defaults follow the seed.
type Renewal struct {
	// Fraction of a certificate's lifetime after which it is renewed
	// (default 0.6).
	Fraction float64 `toml:"fraction"`
	// BackoffMin and BackoffMax bound the wait after a failed renewal
	// (default 30s and 10m).
	BackoffMin Duration `toml:"backoff_min"`
	BackoffMax Duration `toml:"backoff_max"`
}

// Pins are the three trust anchors a node starts from.
type Pins struct {
	ServingCA      pki.Pin
	JoinSigning    pki.Pin
	JoinEncryption pki.Pin
}

// LoadBCD reads and validates config.toml.
func LoadBCD(path string) (*BCD, error) {
	var c BCD
	if err := decodeFile(path, &c); err != nil {
		return nil, err
	}
	c.path = path
	if c.DataDir == "" {
		c.DataDir = DefaultBCDDataDir
	}
	if c.TPM == "" {
		c.TPM = "auto"
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &c, nil
}

// Validate parses the pins and checks the addresses, naming the setting
// that is wrong.
func (c *BCD) Validate() error {
	if c.Server == "" {
		return errors.New("server is required: the control plane's host:port")
	}
	if _, _, err := net.SplitHostPort(c.Server); err != nil {
		return fmt.Errorf("server: want host:port: %w", err)
	}
	if c.ServerName == "" {
		c.ServerName, _, _ = net.SplitHostPort(c.Server)
	}
	if f := c.Renewal.Fraction; f != 0 && (f < 0.05 || f > 0.95) {
		return fmt.Errorf("renewal.fraction: %g is outside 0.05..0.95", f)
	}
	if c.Renewal.BackoffMin.Duration < 0 || c.Renewal.BackoffMax.Duration < c.Renewal.BackoffMin.Duration && c.Renewal.BackoffMax.Duration != 0 {
		return errors.New("renewal.backoff_min and backoff_max: want 0 <= backoff_min <= backoff_max")
	}
	var err error
	if c.Pins, err = ParsePins(
		NamedPin{"serving_ca_spki_pin", c.ServingCASPKIPin},
		NamedPin{"join_signing_key_pin", c.JoinSigningKeyPin},
		NamedPin{"join_encryption_key_pin", c.JoinEncryptionKeyPin},
	); err != nil {
		return err
	}
	return nil
}

// NamedPin is a pin's value with the name the operator wrote it under
// (a setting or a flag), for error messages.
type NamedPin struct{ Name, Value string }

// ParsePins parses the serving CA, join signing and join encryption pins,
// in that order. A missing or malformed pin is an error naming it.
func ParsePins(serving, signing, encryption NamedPin) (Pins, error) {
	var out [3]pki.Pin
	for i, np := range []NamedPin{serving, signing, encryption} {
		if np.Value == "" {
			return Pins{}, fmt.Errorf("%s is required (from the control plane's pki-bundle.json)", np.Name)
		}
		pin, err := pki.ParsePin(np.Value)
		if err != nil {
			return Pins{}, fmt.Errorf("%s: %w", np.Name, err)
		}
		out[i] = pin
	}
	return Pins{ServingCA: out[0], JoinSigning: out[1], JoinEncryption: out[2]}, nil
}

// JWKPath is join-encryption.jwk beside the config file.
func (c *BCD) JWKPath() string {
	if c.path == "" {
		return ""
	}
	return filepath.Join(filepath.Dir(c.path), JWKFile)
}

// ReadJWK returns the join encryption key beside the config file, or nil
// when there is none (the caller then takes it from the well-known
// document).
func (c *BCD) ReadJWK() ([]byte, error) {
	p := c.JWKPath()
	if p == "" {
		return nil, nil
	}
	b, err := os.ReadFile(p)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return b, nil
}
