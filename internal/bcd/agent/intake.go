package agent

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/atomicfile"
	"github.com/nodetrust/nodetrust/internal/bcd/config"
	"github.com/nodetrust/nodetrust/internal/bcd/hwclaims"
	"github.com/nodetrust/nodetrust/internal/bcd/passmarker"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/joinresponse"
	"github.com/nodetrust/nodetrust/tpm"
)

// The files Intake writes, in the folder IntakeDir names.
const (
	// IntakeDirName is the data directory's folder of device identity
	// (mode 0700).
	IntakeDirName = "devid"
	// LDevIDFile is the LDevID chain (PEM, leaf first), LAKCertFile the
	// LAK certificate chain.
	LDevIDFile  = "ldevid.crt"
	LAKCertFile = "lak.crt"
	// DeviceKeyFile is the device key's TPM record (it derives the key
	// again; the private key never leaves the TPM), LAKKeyFile the AK's.
	DeviceKeyFile = "devid.keyrec"
	LAKKeyFile    = "lak.keyrec"
	// IntakeSessionFile is the intake session the admission step names.
	IntakeSessionFile = "intake.json"
)

// intakeFileMode and intakeDirMode keep the device identity the node's.
const (
	intakeFileMode = 0o600
	intakeDirMode  = 0o700
)

// IntakeDir is the folder of device identity in dataDir.
func IntakeDir(dataDir string) string { return filepath.Join(dataDir, IntakeDirName) }

// IntakeConfig configures [Intake].
type IntakeConfig struct {
	Servers    []string
	ServerName string
	Pins       config.Pins
	DataDir    string
	// TPM is the machine's TPM: the device key and the AK are made in it.
	TPM TPM
	// BootIDFile is where the kernel's boot id is read
	// (passmarker.DefaultBootIDPath when empty).
	BootIDFile string
	// EventLog is the boot's measurement log sent with the quote, nil for
	// a TPM without one.
	EventLog []byte
	Claims   hwclaims.Claims
	Version  string
}

// IntakeSession is the intake session as the node keeps it
// (intake.json).
type IntakeSession struct {
	ID       string    `json:"id"`
	Device   string    `json:"device"`
	NotAfter time.Time `json:"not_after"`
	// BootID is the kernel's boot id when the intake quoted the boot:
	// fleetd's verdict is on that boot only, so bcd install writes a pass
	// marker only while the machine is still in it.
	BootID string `json:"boot_id"`
}

// IntakeResult is what Intake got and stored.
type IntakeResult struct {
	Session IntakeSession
	LDevID  []*x509.Certificate
	LAK     []*x509.Certificate
	Dir     string
}

// Intake runs the intake session on the machine's TPM (docs/install.md,
// "Intake"): it makes a device key and an AK, has the AK certify the
// device key over the SHA-256 of the device key's CSR, answers the
// control plane's challenge (credential activation and a quote of the
// boot PCRs over its nonce), checks what comes back — signed by the
// JoinService signing key of join_signing_key_pin, for this CSR; the LDevID
// certifies the device key and the LAK certificate the AK, each chained
// to the roots sent — and stores both chains, the two keys' TPM records
// and the session in <data_dir>/devid (0700; files 0600, each written
// atomically). A refusal's error carries the control plane's message.
func Intake(ctx context.Context, c IntakeConfig) (*IntakeResult, error) {
	if c.TPM == nil {
		return nil, errors.New("intake needs a TPM: set tpm in config.toml (a device path or tcp://host:port) or pass --tpm")
	}
	conn, guard, _, err := Dial(c.Servers, c.ServerName, c.Pins.ServingCA, nil)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	client := joinv1.NewJoinServiceClient(conn)

	key, keyRec, err := c.TPM.NewNodeKey(ctx)
	if err != nil {
		return nil, fmt.Errorf("make the device key in the TPM: %w", err)
	}
	defer key.Close()
	csr, err := pki.CreateCSR(key)
	if err != nil {
		return nil, fmt.Errorf("the device key's CSR: %w", err)
	}
	csrHash := sha256.Sum256(csr)
	tj := &tpmJoin{t: c.TPM, eventLog: c.EventLog}
	defer tj.close()
	ev, err := tj.evidence(ctx, key, csrHash[:])
	if err != nil {
		return nil, err
	}
	req := &joinv1.IntakeRequest{Csr: csr, Tpm: ev, Claims: claimsProto(c.Claims), DaemonVersion: c.Version}
	var signed *joinv1.SignedJoinResult
	for round := 0; signed == nil; round++ {
		if round > maxChallengeRounds {
			return nil, fmt.Errorf("intake still challenged after %d rounds", maxChallengeRounds)
		}
		callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := client.Intake(callCtx, req)
		cancel()
		if err != nil {
			if perr := guard.Err(); perr != nil {
				return nil, fmt.Errorf("the control plane is not the one the pins name: %w", perr)
			}
			return nil, fmt.Errorf("intake: %s", status.Convert(err).Message())
		}
		switch r := resp.Result.(type) {
		case *joinv1.IntakeResponse_Issued:
			if r.Issued == nil {
				return nil, errors.New("the control plane sent an empty intake result")
			}
			signed = r.Issued
		case *joinv1.IntakeResponse_Challenge:
			ans, err := tj.answer(ctx, r.Challenge)
			if err != nil {
				return nil, fmt.Errorf("answer intake round %d: %w", r.Challenge.Round, err)
			}
			req.DeferralId, req.Answer = r.Challenge.DeferralId, ans
		default:
			return nil, errors.New("the control plane sent an empty intake response")
		}
	}
	issued, err := joinresponse.OpenIntake(signed, c.Pins.JoinSigning, csrHash[:])
	if err != nil {
		return nil, err
	}
	now := time.Now()
	ldevid, err := checkDeviceChain("LDevID", issued.LdevidChain, issued.Roots, key.Public(), now)
	if err != nil {
		return nil, err
	}
	lak, err := checkDeviceChain("LAK certificate", issued.LakChain, issued.Roots, tj.ak.Public(), now)
	if err != nil {
		return nil, err
	}
	boot, err := passmarker.BootID(c.BootIDFile)
	if err != nil {
		return nil, err
	}
	res := &IntakeResult{
		Session: IntakeSession{ID: issued.SessionId, Device: issued.Device, NotAfter: time.Unix(0, issued.SessionNotAfterUnixNano).UTC(), BootID: boot},
		LDevID:  ldevid, LAK: lak, Dir: IntakeDir(c.DataDir),
	}
	if err := storeIntake(res, keyRec, tj.ak.Record()); err != nil {
		return nil, err
	}
	return res, nil
}

// checkDeviceChain parses a device certificate chain and checks that its
// leaf certifies pub and chains to one of roots.
func checkDeviceChain(what string, ders, roots [][]byte, pub crypto.PublicKey, now time.Time) ([]*x509.Certificate, error) {
	if len(ders) < 2 {
		return nil, fmt.Errorf("the %s chain has %d certificates, want the leaf and the DevID CA", what, len(ders))
	}
	var chain []*x509.Certificate
	for _, d := range ders {
		c, err := x509.ParseCertificate(d)
		if err != nil {
			return nil, fmt.Errorf("the %s chain: %w", what, err)
		}
		chain = append(chain, c)
	}
	if eq, ok := pub.(interface{ Equal(crypto.PublicKey) bool }); !ok || !eq.Equal(chain[0].PublicKey) {
		return nil, fmt.Errorf("the %s certifies another key than this TPM's", what)
	}
	rootPool, inter := x509.NewCertPool(), x509.NewCertPool()
	for _, d := range roots {
		r, err := x509.ParseCertificate(d)
		if err != nil {
			return nil, fmt.Errorf("the intake's roots: %w", err)
		}
		rootPool.AddCert(r)
	}
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: rootPool, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("the %s does not chain to the control plane's root: %w", what, err)
	}
	if _, err := pki.ParseDeviceCert(chain[0]); err != nil {
		return nil, fmt.Errorf("the %s: %w", what, err)
	}
	return chain, nil
}

// storeIntake writes the device identity into res.Dir: each file
// atomically, 0600, in a 0700 folder; the session last, so that its
// presence marks a complete set.
func storeIntake(res *IntakeResult, devKey, ak tpm.KeyRecord) error {
	if err := os.MkdirAll(res.Dir, intakeDirMode); err != nil {
		return fmt.Errorf("create %s: %w", res.Dir, err)
	}
	if err := os.Chmod(res.Dir, intakeDirMode); err != nil {
		return fmt.Errorf("chmod %s: %w", res.Dir, err)
	}
	devPEM, err := tpm.MarshalKeyRecord(devKey)
	if err != nil {
		return err
	}
	akPEM, err := tpm.MarshalKeyRecord(ak)
	if err != nil {
		return err
	}
	sess, err := json.MarshalIndent(res.Session, "", "  ")
	if err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		data []byte
	}{
		{DeviceKeyFile, devPEM},
		{LAKKeyFile, akPEM},
		{LDevIDFile, pki.EncodeCertsPEM(res.LDevID...)},
		{LAKCertFile, pki.EncodeCertsPEM(res.LAK...)},
		{IntakeSessionFile, append(sess, '\n')},
	} {
		if err := atomicfile.WriteFile(filepath.Join(res.Dir, f.name), f.data, intakeFileMode); err != nil {
			return fmt.Errorf("store %s: %w", f.name, err)
		}
	}
	return nil
}
