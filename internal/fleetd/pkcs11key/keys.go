package pkcs11key

import (
	"errors"
	"fmt"
	"time"
)

// Config says how to reach the tokens. A URI's own module-path and
// pin-source win over Module and PINFile.
type Config struct {
	// Module is the PKCS#11 library for URIs that name none
	// (pkcs11.module in fleetd.toml).
	Module string
	// PINFile holds the user PIN for URIs that name no pin-source
	// (pkcs11.pin_file in fleetd.toml).
	PINFile string
	// OnChange, when set, is told each time a token stops answering and
	// each time it answers again. It must not block.
	OnChange func(Event)
	// RetryInterval is the least time between two attempts to reconnect
	// to a token that went away (default 1s). In between, signing fails at
	// once.
	RetryInterval time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Event is a change of a token's availability.
type Event struct {
	// Token names the token (its URI without object or query).
	Token string
	// Module is the PKCS#11 library.
	Module string
	// Available is false when the token stopped answering, true when it
	// answers again.
	Available bool
	// Err is why it became unavailable.
	Err error
}

// ErrNoCgo means this fleetd was built without cgo (CGO_ENABLED=0) and so
// cannot load a PKCS#11 module.
var ErrNoCgo = errors.New("this fleetd was built without cgo (CGO_ENABLED=0) and cannot load a PKCS#11 module; use a fleetd built with CGO_ENABLED=1 (make build does, where a C compiler is installed), or keep the key in a file")

// ErrPIN means the token refused the PIN. fleetd never retries a refused
// PIN by itself: a token locks after a few wrong ones.
var ErrPIN = errors.New("the token refused the PIN")

// DefaultLabelPrefix starts the labels of the keys `fleetd init --pkcs11`
// makes when its URI names no object: nodetrust-node-ca, …
const DefaultLabelPrefix = "nodetrust"

// pinHelp is the way back from a refused PIN.
func pinHelp(pinFile string) string {
	return fmt.Sprintf("write the token's user PIN into %s (one line, mode 0600) and start fleetd again; it does not retry, since a token locks after a few wrong PINs (SoftHSM2: softhsm2-util --show-slots; a YubiKey: ykman piv access change-pin)", pinFile)
}

func (c *Config) defaults() {
	if c.RetryInterval <= 0 {
		c.RetryInterval = time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// where resolves the module and PIN file of u from u and c.
func (c *Config) where(u *URI) (module, pinFile string, err error) {
	module, pinFile = u.ModulePath, u.PINSource
	if module == "" {
		module = c.Module
	}
	if pinFile == "" {
		pinFile = c.PINFile
	}
	if module == "" {
		return "", "", fmt.Errorf("%s names no PKCS#11 module: set pkcs11.module in fleetd.toml (SoftHSM2: /usr/lib/softhsm/libsofthsm2.so) or add ?module-path=… to the URI", u.TokenString())
	}
	if pinFile == "" {
		return "", "", fmt.Errorf("%s names no PIN: set pkcs11.pin_file in fleetd.toml or add ?pin-source=FILE to the URI (never the PIN itself)", u.TokenString())
	}
	return module, pinFile, nil
}
