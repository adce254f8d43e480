package render

import (
	"fmt"
	"net"
	"os"
	"path/filepath"

	"github.com/nodetrust/nodetrust/pki"
)

// FleetdFromPKI is the Fleetd of a control plane whose `fleetd init` files
// are in pkiDir: the server name and three pins of pki-bundle.json and the
// join encryption key of join-encryption.jwk, at server (host:port, the
// address installed machines reach; an advertised address, never a
// loopback listener).
func FleetdFromPKI(pkiDir, server string) (Fleetd, error) {
	if _, _, err := net.SplitHostPort(server); err != nil {
		return Fleetd{}, fmt.Errorf("the address installed machines reach: want host:port: %w", err)
	}
	b, err := pki.ReadBundle(filepath.Join(pkiDir, pki.BundleFile))
	if err != nil {
		return Fleetd{}, err
	}
	jwk, err := os.ReadFile(filepath.Join(pkiDir, pki.JoinEncryptionJWKFile))
	if err != nil {
		return Fleetd{}, fmt.Errorf("read the join encryption key: %w", err)
	}
	return Fleetd{
		Server: server, ServerName: b.ServerName,
		ServingCASPKIPin: b.ServingCASPKIPin.String(), JoinSigningKeyPin: b.JoinSigningKeyPin.String(),
		JoinEncryptionKeyPin: b.JoinEncryptionKeyPin.String(), JoinEncryptionJWK: string(jwk),
	}, nil
}
