// Package pkcs11key keeps the control plane's signing keys in PKCS#11
// tokens (a YubiKey, an HSM; SoftHSM2 in tests): it parses the RFC 7512
// URIs that name them, generates keys inside a token for `fleetd init`, and
// opens them as crypto.Signers for `fleetd serve`, reconnecting to a token
// that went away once it returns.
//
// It is fleetd's: its wiring and command layer import it, and nothing of
// bcd does, so bcd never links cgo or crypto11 (internal/repotest checks
// this). The binding to the token (github.com/ThalesGroup/crypto11) needs
// cgo; a build without cgo (CGO_ENABLED=0, as release builds are) compiles
// a stand-in whose Open and Generate refuse with [ErrNoCgo], naming the key
// and the way back.
package pkcs11key
