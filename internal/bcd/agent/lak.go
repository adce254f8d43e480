package agent

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm"
)

// installedLAK is the LAK an intake stored in <data_dir>/devid: the AK's
// record (lak.keyrec) and its certificate chain (lak.crt, leaf first).
type installedLAK struct {
	rec   tpm.KeyRecord
	chain []*x509.Certificate
}

// readLAK reads the LAK of dataDir's device identity; nil, nil when there
// is none (no lak.keyrec: a node installed without intake). A record
// without a readable certificate is an error: run bcd intake again.
func readLAK(dataDir string) (*installedLAK, error) {
	dir := IntakeDir(dataDir)
	recPath := filepath.Join(dir, LAKKeyFile)
	if _, err := os.Stat(recPath); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	rec, err := readKeyRecord(recPath)
	if err != nil {
		return nil, err
	}
	chain, err := pki.ReadCerts(filepath.Join(dir, LAKCertFile))
	if err == nil && len(chain) == 0 {
		err = errors.New("no certificate in " + LAKCertFile)
	}
	if err != nil {
		return nil, fmt.Errorf("%s holds a LAK without its certificate (%w): run bcd intake again, or remove %s to join with a fresh AK", dir, err, dir)
	}
	return &installedLAK{rec: rec, chain: chain}, nil
}

// check fails unless the certificate certifies ak.
func (l *installedLAK) check(ak tpm.AttestationKey) error {
	eq, ok := ak.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !eq.Equal(l.chain[0].PublicKey) {
		return fmt.Errorf("%s certifies another AK than %s: run bcd intake again", LAKCertFile, LAKKeyFile)
	}
	return nil
}

// wire is the chain to send with the evidence at now: DER, leaf first;
// none once the leaf has expired by the node's clock (the control plane
// then knows the LAK from the node's record, set at its first join).
func (l *installedLAK) wire(now time.Time) [][]byte {
	if now.After(l.chain[0].NotAfter) {
		return nil
	}
	out := make([][]byte, 0, len(l.chain))
	for _, c := range l.chain {
		out = append(out, c.Raw)
	}
	return out
}
