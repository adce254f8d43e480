package agent

import (
	"context"
	"crypto"
	"encoding/base64"
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
	"github.com/nodetrust/nodetrust/internal/bcd/passmarker"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/confirm"
	"github.com/nodetrust/nodetrust/pki/netreport"
	"github.com/nodetrust/nodetrust/tpm"
)

// DefaultCodeFile is where Install writes the install code: the file the
// provision script reads (docs/install.md, "Provision script").
const DefaultCodeFile = "/run/nodetrust/install-code"

// BootVerdictPass is the InstallResponse.boot_verdict of an intake whose
// boot fleetd's policy passed: the only one that writes the pass marker.
const BootVerdictPass = "pass"

// InstallConfig configures [Install].
type InstallConfig struct {
	Servers    []string
	ServerName string
	Pins       config.Pins
	// DataDir holds devid/ from the intake.
	DataDir string
	// TPM is the TPM of the intake: the device key and the AK are derived
	// again from their records.
	TPM TPM
	// Report is the network report to sign; its observed_at is when LLDP
	// was read.
	Report netreport.Report
	// CodeFile is where the code goes (DefaultCodeFile when empty);
	// PassMarker and BootIDFile the pass marker's paths
	// (passmarker.DefaultPath, passmarker.DefaultBootIDPath when empty).
	CodeFile   string
	PassMarker string
	BootIDFile string
	Version    string
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// InstallResult is what Install got and wrote. It holds no code.
type InstallResult struct {
	Device      string
	ProductUUID string
	ExpiresAt   time.Time
	CodeFile    string
	// BootVerdict is fleetd's verdict of the intake's boot; PassMarker
	// the marker written, empty when the verdict was not a pass or the
	// machine has rebooted since the intake (Rebooted).
	BootVerdict string
	PassMarker  string
	Rebooted    bool
}

// Install asks for this machine's installation (docs/install.md,
// "Admission"): it signs the network report and a confirmation binding
// the intake session, the report and the time with the device key (from
// devid.keyrec), sends them with the LDevID, unwraps the install code with
// TPM2_ActivateCredential on the intake's AK (lak.keyrec), writes it to
// the code file (0600) and, when fleetd's verdict of the intake's boot was
// a pass, the pass marker. The code is never returned, printed or logged.
// A refusal's error carries the control plane's "Install refused" message.
func Install(ctx context.Context, c InstallConfig) (*InstallResult, error) {
	if c.TPM == nil {
		return nil, errors.New("install needs the TPM of the intake: set tpm in config.toml or pass --tpm")
	}
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	dir := IntakeDir(c.DataDir)
	sessJSON, err := os.ReadFile(filepath.Join(dir, IntakeSessionFile))
	if err != nil {
		return nil, fmt.Errorf("read the intake session (%w): run bcd intake first", err)
	}
	var sess IntakeSession
	if err := json.Unmarshal(sessJSON, &sess); err != nil || sess.ID == "" {
		return nil, fmt.Errorf("%s is not an intake session (%v): run bcd intake again", IntakeSessionFile, err)
	}
	ldevid, err := pki.ReadCerts(filepath.Join(dir, LDevIDFile))
	if err != nil {
		return nil, fmt.Errorf("read the LDevID: %w: run bcd intake again", err)
	}
	devRec, err := readKeyRecord(filepath.Join(dir, DeviceKeyFile))
	if err != nil {
		return nil, err
	}
	akRec, err := readKeyRecord(filepath.Join(dir, LAKKeyFile))
	if err != nil {
		return nil, err
	}
	key, err := c.TPM.LoadNodeKey(ctx, devRec)
	if err != nil {
		return nil, fmt.Errorf("load the device key from the TPM (is this the TPM of the intake?): %w", err)
	}
	defer key.Close()
	if eq, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool }); len(ldevid) == 0 || !ok || !eq.Equal(ldevid[0].PublicKey) {
		return nil, errors.New("the LDevID certifies another key than devid.keyrec's: run bcd intake again")
	}

	signed, err := netreport.Sign(c.Report, key)
	if err != nil {
		return nil, err
	}
	repJSON, err := signed.Marshal()
	if err != nil {
		return nil, err
	}
	at := now()
	sig, err := confirm.Sign(confirm.Confirmation{SessionID: sess.ID, ReportDigest: netreport.Digest(c.Report), At: at}, key)
	if err != nil {
		return nil, err
	}
	req := &joinv1.InstallRequest{SessionId: sess.ID, NetworkReport: repJSON, ConfirmedAtUnixNano: at.UnixNano(),
		ConfirmationSignature: sig, DaemonVersion: c.Version}
	for _, crt := range ldevid {
		req.LdevidChain = append(req.LdevidChain, crt.Raw)
	}

	conn, guard, _, err := Dial(c.Servers, c.ServerName, c.Pins.ServingCA, nil)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	callCtx, cancel := context.WithTimeout(ctx, time.Minute)
	resp, err := joinv1.NewJoinServiceClient(conn).Install(callCtx, req)
	cancel()
	if err != nil {
		if perr := guard.Err(); perr != nil {
			return nil, fmt.Errorf("the control plane is not the one the pins name: %w", perr)
		}
		return nil, fmt.Errorf("install: %s", status.Convert(err).Message())
	}

	ak, err := c.TPM.LoadAK(ctx, akRec)
	if err != nil {
		return nil, fmt.Errorf("load the intake's AK from the TPM: %w", err)
	}
	defer ak.Close()
	ek, err := c.TPM.EK(ctx, tpm.EKAuto)
	if err != nil {
		return nil, fmt.Errorf("read the EK: %w", err)
	}
	secret, err := c.TPM.ActivateCredential(ctx, ak, ek, resp.CredentialBlob, resp.EncryptedSecret)
	if err != nil {
		return nil, fmt.Errorf("unwrap the install code with the TPM (TPM2_ActivateCredential): %w", err)
	}
	text, err := codeText(secret)
	clear(secret)
	if err != nil {
		return nil, err
	}
	res := &InstallResult{Device: resp.Device, ProductUUID: resp.ProductUuid, ExpiresAt: time.Unix(0, resp.ExpiresAtUnixNano).UTC(),
		CodeFile: c.CodeFile, BootVerdict: resp.BootVerdict}
	if res.CodeFile == "" {
		res.CodeFile = DefaultCodeFile
	}
	if err := os.MkdirAll(filepath.Dir(res.CodeFile), 0o700); err != nil {
		return nil, fmt.Errorf("write the install code: %w", err)
	}
	if err := atomicfile.WriteFile(res.CodeFile, append(text, '\n'), 0o600); err != nil {
		return nil, fmt.Errorf("write the install code to %s: %w", res.CodeFile, err)
	}
	clear(text)
	if resp.BootVerdict != BootVerdictPass {
		return res, nil
	}
	boot, err := passmarker.BootID(c.BootIDFile)
	if err != nil {
		return nil, err
	}
	if sess.BootID != boot {
		// fleetd judged another boot: this one was never quoted.
		res.Rebooted = true
		return res, nil
	}
	m := passmarker.Marker{UUID: resp.ProductUuid, BootID: boot, Time: now().UTC()}
	if err := passmarker.Write(c.PassMarker, m); err != nil {
		return nil, err
	}
	res.PassMarker = c.PassMarker
	if res.PassMarker == "" {
		res.PassMarker = passmarker.DefaultPath
	}
	return res, nil
}

// codeText is the install code's text form (43 characters of unpadded
// base64url) of the 32 bytes the TPM unwrapped.
func codeText(secret []byte) ([]byte, error) {
	const size = 32
	if len(secret) != size {
		return nil, fmt.Errorf("the unwrapped install code is %d bytes, want %d", len(secret), size)
	}
	out := make([]byte, base64URL.EncodedLen(size))
	base64URL.Encode(out, secret)
	return out, nil
}

// readKeyRecord reads a TPM key record written by the intake.
func readKeyRecord(path string) (tpm.KeyRecord, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return tpm.KeyRecord{}, fmt.Errorf("read %s (%w): run bcd intake again", filepath.Base(path), err)
	}
	rec, err := tpm.ParseKeyRecord(b)
	if err != nil {
		return tpm.KeyRecord{}, fmt.Errorf("%s: %w", filepath.Base(path), err)
	}
	return rec, nil
}

// base64URL is the install code's alphabet, unpadded.
var base64URL = base64.RawURLEncoding
