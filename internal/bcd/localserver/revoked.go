package localserver

import "time"

// PeerCertRevoked tells the daemon that the certificate of node nodeID with
// serial serial (lower-case hex, pki.SerialHex) was revoked; notAfter is
// its expiry, zero when unknown. From then on the calls of other machines
// whose machine proof is made with that certificate are refused, whether
// the proof was cached or not (callsig.ProofCache.RevokeCert); the node's
// other certificates, such as one it got after the revocation, are
// accepted. The agent calls it with what fleetd's revocation feed sends.
func (s *Server) PeerCertRevoked(nodeID, serial string, notAfter time.Time) {
	s.proofs.RevokeCert(nodeID, serial, notAfter, s.now())
}
