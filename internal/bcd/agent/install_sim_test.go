//go:build tpmsim

package agent_test

import (
	"context"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/hwclaims"
	"github.com/nodetrust/nodetrust/internal/bcd/passmarker"
	"github.com/nodetrust/nodetrust/internal/fleetd/install"
	"github.com/nodetrust/nodetrust/pki/confirm"
	"github.com/nodetrust/nodetrust/pki/netreport"
	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// verdictServer answers Install as fleetd would for an admitted request —
// a code wrapped to the session's EK and AK, read from the real control
// plane's store — with the boot verdict a test chooses, which the real
// server only says "pass" for under a boot policy. It checks the
// confirmation as fleetd does, so the agent's signing is exercised too.
type verdictServer struct {
	joinv1.UnimplementedJoinServiceServer
	cp      *controlPlane
	code    install.Code
	verdict atomic.Value // string
}

func (v *verdictServer) Install(ctx context.Context, req *joinv1.InstallRequest) (*joinv1.InstallResponse, error) {
	sess, err := v.cp.db.GetIntakeSession(ctx, req.SessionId)
	if err != nil {
		return nil, err
	}
	rep, err := netreport.Unmarshal(req.NetworkReport)
	if err != nil {
		return nil, err
	}
	ldevid, err := x509.ParseCertificate(req.LdevidChain[0])
	if err != nil {
		return nil, err
	}
	if err := rep.Verify(ldevid.PublicKey); err != nil {
		return nil, err
	}
	c := confirm.Confirmation{SessionID: req.SessionId, ReportDigest: netreport.Digest(rep.Report), At: time.Unix(0, req.ConfirmedAtUnixNano)}
	if err := confirm.Verify(c, ldevid.PublicKey, req.ConfirmationSignature); err != nil {
		return nil, err
	}
	w, err := install.WrapCode(sess.EKPublic, sess.AKName, v.code)
	if err != nil {
		return nil, err
	}
	return &joinv1.InstallResponse{CredentialBlob: w.CredentialBlob, EncryptedSecret: w.EncryptedSecret, Device: sess.Device,
		ProductUuid: "00000000-0000-4000-8000-0000000000ce", ExpiresAtUnixNano: time.Now().Add(time.Hour).UnixNano(), BootVerdict: v.verdict.Load().(string)}, nil
}

func TestSimInstallUnwrapsTheCodeAndWritesThePassMarkerOnlyOnAPass(t *testing.T) {
	tp, _ := tpmtest.OpenSim(t)
	ek, err := tp.EK(t.Context(), tpm.EKAuto)
	if err != nil {
		t.Fatal(err)
	}
	ekPin, err := attest.EKPin(ek.Public)
	if err != nil {
		t.Fatal(err)
	}
	cp := startControlPlane(t)
	const uuid = "00000000-0000-4000-8000-0000000000ce"
	declareBound(t, cp, "web-03", uuid, ekPin)
	run := t.TempDir()
	bootID := filepath.Join(run, "boot_id")
	if err := os.WriteFile(bootID, []byte("0f8e2a51-6a43-4cfc-9a7c-52c2c4a3a1b9\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, err := agent.Intake(t.Context(), agent.IntakeConfig{Servers: []string{cp.addr}, ServerName: "localhost", Pins: cp.pins, DataDir: dir,
		TPM: agent.Direct(tp), BootIDFile: bootID, Claims: hwclaims.Claims{ProductUUID: uuid, Hostname: "hookos"}}); err != nil {
		t.Fatalf("intake: %v", err)
	}

	code, err := install.NewCode(nil)
	if err != nil {
		t.Fatal(err)
	}
	vs := &verdictServer{cp: cp, code: code}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(cp.srv.TLSConfig())))
	joinv1.RegisterJoinServiceServer(gs, vs)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)

	report := netreport.Report{Neighbor: netreport.Neighbor{Interface: "eth0", ChassisID: "sw-01", PortID: "Gi1/0/17"}, ObservedAt: time.Now()}
	for _, verdict := range []string{"fail", "none", "pass"} {
		t.Run(verdict, func(t *testing.T) {
			vs.verdict.Store(verdict)
			ic := agent.InstallConfig{Servers: []string{ln.Addr().String()}, ServerName: "localhost", Pins: cp.pins, DataDir: dir, TPM: agent.Direct(tp),
				Report: report, CodeFile: filepath.Join(run, verdict, "install-code"), PassMarker: filepath.Join(run, verdict, "boot-pass"), BootIDFile: bootID}
			res, err := agent.Install(t.Context(), ic)
			if err != nil {
				t.Fatalf("install: %v", err)
			}
			b, err := os.ReadFile(ic.CodeFile)
			if err != nil || string(b) != code.Bearer()+"\n" {
				t.Fatalf("the code file does not hold the wrapped code: %v", err)
			}
			if st, _ := os.Stat(ic.CodeFile); st.Mode().Perm() != 0o600 {
				t.Errorf("code file mode %v", st.Mode())
			}
			mb, err := os.ReadFile(ic.PassMarker)
			if verdict != "pass" {
				if !os.IsNotExist(err) || res.PassMarker != "" {
					t.Fatalf("a %s verdict wrote the pass marker: %v", verdict, err)
				}
				return
			}
			m, err := passmarker.Parse(mb)
			if err != nil || m.UUID != uuid || m.BootID != "0f8e2a51-6a43-4cfc-9a7c-52c2c4a3a1b9" || res.PassMarker != ic.PassMarker {
				t.Fatalf("pass marker %+v, %v", m, err)
			}
		})
	}

	// After a reboot, fleetd's pass is on a boot that is gone: no marker.
	if err := os.WriteFile(bootID, []byte("6b1d3c77-0000-4000-8000-00000000b007\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	vs.verdict.Store("pass")
	ic := agent.InstallConfig{Servers: []string{ln.Addr().String()}, ServerName: "localhost", Pins: cp.pins, DataDir: dir, TPM: agent.Direct(tp),
		Report: report, CodeFile: filepath.Join(run, "rebooted", "install-code"), PassMarker: filepath.Join(run, "rebooted", "boot-pass"), BootIDFile: bootID}
	res, err := agent.Install(t.Context(), ic)
	if err != nil {
		t.Fatalf("install after a reboot: %v", err)
	}
	if _, err := os.Stat(ic.PassMarker); !os.IsNotExist(err) || res.PassMarker != "" || !res.Rebooted {
		t.Fatalf("a pass on the intake's boot wrote a marker in another boot: %v, %+v", err, res)
	}
}
