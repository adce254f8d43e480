//go:build tpmsim

package service_test

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/fleetd/install"
	"github.com/nodetrust/nodetrust/internal/fleetd/lifecycle"
	"github.com/nodetrust/nodetrust/internal/fleetd/render"
	"github.com/nodetrust/nodetrust/internal/fleetd/roles"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/tinkerbell"
	"github.com/nodetrust/nodetrust/pki/confirm"
	"github.com/nodetrust/nodetrust/pki/netreport"
)

// The Install RPC (docs/install.md, "Admission") against the in-process
// simulator: a machine that passed intake asks for installation with its
// LDevID, a network report and a confirmation signed by its device key.

// installEnv is a server with auto-provision and the Install RPC wired to
// a real releaser over its store and a template renderer for workers, and
// a machine that passed intake as web-01.
type installEnv struct {
	*env
	m   *tpmMachine
	res *joinv1.IntakeResult
	// set are the Install RPC's settings, for a test to change and set
	// again.
	set service.InstallSettings
}

const installTmpl = "node={{.node.name}} site={{.node.site}} token={{.join_credential}}\n"

func newInstallEnv(t *testing.T, site string) *installEnv {
	t.Helper()
	m, roots := newTPMMachine(t)
	v, err := attest.New(attest.Config{Roots: roots})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, func(c *service.Config) { c.EKVerifier, c.AutoProvision = v, true })
	rel, err := install.New(install.Config{Store: e.db, Logger: slog.New(slog.DiscardHandler), Now: e.clock.Now,
		Activator: install.LifecycleActivator{Manager: &lifecycle.Manager{Store: e.db}}})
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := render.NewTemplate("worker", installTmpl, "")
	if err != nil {
		t.Fatal(err)
	}
	set := service.InstallSettings{Releaser: rel, Renderers: render.NewRegistry(map[string]render.Renderer{"worker": tmpl}),
		Fleetd: render.Fleetd{Server: "fleetd.example.org:8443"}, CredentialLifetime: 6 * time.Hour}
	e.srv.SetInstall(set)
	ekPin, err := attest.EKPin(m.ek.Public)
	if err != nil {
		t.Fatal(err)
	}
	d := installDecl(ekPin)
	d.Site, d.InstallDisk, d.SwitchChassis, d.SwitchPort = site, "/dev/sda", "sw-01", "Gi1/0/17"
	declareAs(t, e, roles.Declarer, d)
	res, err := intake(t, e, m)
	if err != nil {
		t.Fatalf("intake: %v", err)
	}
	return &installEnv{env: e, m: m, res: res, set: set}
}

// report is what the machine saw at the server's now plus ago.
func (ie *installEnv) report(port string, ago time.Duration) netreport.Report {
	return netreport.Report{Neighbor: netreport.Neighbor{Interface: "eth0", ChassisName: "sw-01", ChassisIDType: "mac",
		ChassisID: "6a:d7:ab:dc:5d:e9", PortIDType: "ifname", PortID: port}, ObservedAt: ie.clock.Now().Add(-ago)}
}

// request is the machine's request for r, its confirmation signed by
// signer at at.
func (ie *installEnv) request(t *testing.T, r netreport.Report, signer crypto.Signer, at time.Time) *joinv1.InstallRequest {
	t.Helper()
	signed, err := netreport.Sign(r, ie.m.key)
	if err != nil {
		t.Fatal(err)
	}
	js, err := signed.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	sig, err := confirm.Sign(confirm.Confirmation{SessionID: ie.res.SessionId, ReportDigest: netreport.Digest(r), At: at}, signer)
	if err != nil {
		t.Fatal(err)
	}
	return &joinv1.InstallRequest{SessionId: ie.res.SessionId, LdevidChain: ie.res.LdevidChain, NetworkReport: js,
		ConfirmedAtUnixNano: at.UnixNano(), ConfirmationSignature: sig}
}

// wantInstallRefused checks err is the wire's install refusal saying do,
// that the server logged rule, and that no code was issued.
func wantInstallRefused(t *testing.T, ie *installEnv, err error, do, rule string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != codes.PermissionDenied || !strings.HasPrefix(st.Message(), "Install refused: ") || !strings.Contains(st.Message(), do) {
		t.Fatalf("error %v, want PERMISSION_DENIED Install refused saying %q", err, do)
	}
	if len(ie.logs.find("install refused", "rule", rule)) == 0 {
		t.Errorf("no install refusal in the log names rule %s", rule)
	}
	if _, err := ie.db.GetConfigRelease(t.Context(), intakeUUID); err == nil {
		t.Errorf("a refused install stored a release")
	}
}

func TestSimInstallIssuesACodeOnlyTheSessionsTPMUnwraps(t *testing.T) {
	ie := newInstallEnv(t, "rack1")
	now := ie.clock.Now()
	resp, err := ie.join.Install(t.Context(), ie.request(t, ie.report("Gi1/0/17", time.Minute), ie.m.key, now))
	if err != nil {
		t.Fatalf("install: %v", err)
	}
	if resp.Device != "web-01" || resp.ProductUuid != intakeUUID || resp.BootVerdict != "none" {
		t.Errorf("response %s %s %s", resp.Device, resp.ProductUuid, resp.BootVerdict)
	}
	secret, err := ie.m.tp.ActivateCredential(t.Context(), ie.m.ak, ie.m.ek, resp.CredentialBlob, resp.EncryptedSecret)
	if err != nil {
		t.Fatalf("the session's TPM cannot unwrap the code: %v", err)
	}
	if _, err := install.CodeFromSecret(secret); err != nil {
		t.Fatalf("the unwrapped secret is no code: %v", err)
	}
	if rel, err := ie.db.GetConfigRelease(t.Context(), intakeUUID); err != nil || rel.NodeID != "web-01" || rel.State != store.ReleaseReady {
		t.Errorf("release %+v, %v", rel, err)
	}
	// The auto-provision was written before the code was issued.
	if st := ie.storedNode(t, "web-01").State; st != store.StateProvisioning {
		t.Errorf("web-01 is %s, want provisioning", st)
	}
	// The render's join credential: a token for web-01 alone, expiring
	// the credential lifetime after the render.
	toks, err := ie.db.ListTokens(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, tk := range toks {
		if tk.CreatedBy == "install" {
			found = tk.NodeID == "web-01" && tk.Role == "worker" && tk.Site == "rack1" && tk.ExpiresAt.Equal(now.Add(6*time.Hour))
		}
	}
	if !found {
		t.Errorf("no join token for web-01 by install among %+v", toks)
	}
	if a := ie.audit(t, "install"); len(a) != 1 || a[0].Subject != "web-01" {
		t.Errorf("audit %+v", a)
	}
}

func TestSimInstallRefusals(t *testing.T) {
	ie := newInstallEnv(t, "rack1")
	now := ie.clock.Now()
	good := ie.report("Gi1/0/17", time.Minute)
	other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("an unknown session", func(t *testing.T) {
		req := ie.request(t, good, ie.m.key, now)
		req.SessionId = "0123456789abcdef0123456789abcdef"
		_, err := ie.join.Install(t.Context(), req)
		wantInstallRefused(t, ie, err, "run bcd intake again", "intake-session")
	})
	t.Run("the LAK certificate in place of the LDevID", func(t *testing.T) {
		req := ie.request(t, good, ie.m.key, now)
		req.LdevidChain = ie.res.LakChain
		_, err := ie.join.Install(t.Context(), req)
		wantInstallRefused(t, ie, err, "run bcd intake again", "ldevid")
	})
	t.Run("a confirmation signed by another key", func(t *testing.T) {
		_, err := ie.join.Install(t.Context(), ie.request(t, good, other, now))
		wantInstallRefused(t, ie, err, "not signed by this intake's device key", "confirmation")
	})
	t.Run("a confirmation for another report", func(t *testing.T) {
		req := ie.request(t, good, ie.m.key, now)
		swapped := ie.request(t, ie.report("Gi1/0/18", time.Minute), ie.m.key, now)
		req.NetworkReport = swapped.NetworkReport
		_, err := ie.join.Install(t.Context(), req)
		wantInstallRefused(t, ie, err, "not signed by this intake's device key", "confirmation")
	})
	t.Run("an old confirmation", func(t *testing.T) {
		_, err := ie.join.Install(t.Context(), ie.request(t, good, ie.m.key, now.Add(-10*time.Minute)))
		wantInstallRefused(t, ie, err, "check the machine's clock", "confirmation")
	})
	t.Run("another port", func(t *testing.T) {
		_, err := ie.join.Install(t.Context(), ie.request(t, ie.report("Gi1/0/18", time.Minute), ie.m.key, now))
		wantInstallRefused(t, ie, err, "check its cable", "expected-port")
	})
	t.Run("an old report", func(t *testing.T) {
		_, err := ie.join.Install(t.Context(), ie.request(t, ie.report("Gi1/0/17", time.Hour), ie.m.key, now))
		wantInstallRefused(t, ie, err, "send a fresh one", "network-report-age")
	})
	t.Run("a stale session", func(t *testing.T) {
		ie.clock.Advance(service.DefaultIntakeWindow + time.Second)
		later := ie.clock.Now()
		_, err := ie.join.Install(t.Context(), ie.request(t, ie.report("Gi1/0/17", 0), ie.m.key, later))
		wantInstallRefused(t, ie, err, "stale session", "intake-session")
	})
	if st, err := ie.db.GetNode(t.Context(), "web-01"); err == nil && st.State == store.StateProvisioning {
		t.Errorf("a refused install provisioned web-01")
	}
}

func TestSimInstallRenderErrorIssuesNoCodeAndNoCredential(t *testing.T) {
	// The template needs the site, which the declaration lacks.
	ie := newInstallEnv(t, "")
	_, err := ie.join.Install(t.Context(), ie.request(t, ie.report("Gi1/0/17", 0), ie.m.key, ie.clock.Now()))
	wantInstallRefused(t, ie, err, "cannot be rendered", "render")
	toks, err := ie.db.ListTokens(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range toks {
		if tk.CreatedBy == "install" {
			t.Errorf("a refused render left a join token: %+v", tk)
		}
	}
	if recs := ie.logs.find("install refused", "reason", "site"); len(recs) == 0 {
		t.Errorf("the log does not name the missing field")
	}
	// The credential never reaches the log.
	ie.logs.mu.Lock()
	defer ie.logs.mu.Unlock()
	for _, r := range ie.logs.recs {
		for k, v := range r.attrs {
			if strings.Contains(v, service.TokenPrefix) {
				t.Errorf("log %q attribute %s holds a join credential", r.msg, k)
			}
		}
	}
}

// A machine whose config was fetched (the code burned) is not installed
// again before its activation settles: a second install would replace the
// release and lose the activation.
func TestSimInstallAfterTheReleaseIsRefused(t *testing.T) {
	ie := newInstallEnv(t, "rack1")
	now := ie.clock.Now()
	if _, err := ie.join.Install(t.Context(), ie.request(t, ie.report("Gi1/0/17", time.Minute), ie.m.key, now)); err != nil {
		t.Fatalf("install: %v", err)
	}
	rel, err := ie.db.GetConfigRelease(t.Context(), intakeUUID)
	if err != nil {
		t.Fatal(err)
	}
	if err := ie.db.ClaimConfigRelease(t.Context(), intakeUUID, rel.Generation, "fetch-1", now, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := ie.db.BurnConfigRelease(t.Context(), intakeUUID, rel.Generation, "fetch-1", now); err != nil {
		t.Fatal(err)
	}
	_, err = ie.join.Install(t.Context(), ie.request(t, ie.report("Gi1/0/17", time.Minute), ie.m.key, now))
	st, _ := status.FromError(err)
	if st.Code() != codes.PermissionDenied || !strings.Contains(st.Message(), "already released") {
		t.Fatalf("a second install after the release: %v", err)
	}
	if len(ie.logs.find("install refused", "rule", string(service.RuleReleased))) == 0 {
		t.Errorf("no install refusal in the log names rule %s", service.RuleReleased)
	}
	if got, err := ie.db.GetConfigRelease(t.Context(), intakeUUID); err != nil || got.Generation != rel.Generation || got.State != store.ReleaseBurned {
		t.Errorf("the burned release was replaced: %+v, %v", got, err)
	}
}

// recordingProvisioner stands in for the Tinkerbell objects' writer
// (internal/fleetd/tinkerbell, tested against a real API server): it
// records the declarations it was given, and whether the install code
// was issued when it was called.
type recordingProvisioner struct {
	ie    *installEnv
	err   error
	decls []store.Declaration
	coded []bool
}

func (p *recordingProvisioner) Apply(ctx context.Context, d store.Declaration) (tinkerbell.Objects, error) {
	p.decls = append(p.decls, d)
	_, err := p.ie.db.GetConfigRelease(ctx, intakeUUID)
	p.coded = append(p.coded, err == nil)
	return tinkerbell.Objects{Namespace: "tink-system", Hardware: d.Name, Template: d.Name, Workflow: d.Name}, p.err
}

func TestSimInstallWritesTheProvisioningObjects(t *testing.T) {
	ie := newInstallEnv(t, "rack1")
	prov := &recordingProvisioner{ie: ie}
	set := ie.set
	set.Provisioner = prov
	ie.srv.SetInstall(set)
	if _, err := ie.join.Install(t.Context(), ie.request(t, ie.report("Gi1/0/17", time.Minute), ie.m.key, ie.clock.Now())); err != nil {
		t.Fatalf("install: %v", err)
	}
	if len(prov.decls) != 1 || prov.decls[0].Name != "web-01" || prov.decls[0].ProductUUID != intakeUUID || prov.decls[0].InstallDisk != "/dev/sda" {
		t.Fatalf("the provisioner was given %+v, want web-01's declaration once", prov.decls)
	}
	if !prov.coded[0] {
		t.Error("the provisioning objects were written before the install code was issued")
	}
	if a := ie.audit(t, "install"); len(a) != 1 || !strings.Contains(a[0].Detail, "Workflow tink-system/web-01") {
		t.Errorf("the install's audit does not name the objects: %+v", a)
	}

	// A failure to write them fails the install, to be retried.
	prov.err = errors.New("the API server is unreachable")
	_, err := ie.join.Install(t.Context(), ie.request(t, ie.report("Gi1/0/17", time.Minute), ie.m.key, ie.clock.Now()))
	if st, _ := status.FromError(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "retry later") {
		t.Fatalf("install with a failing provisioner: %v, want UNAVAILABLE retry later", err)
	}
	if len(prov.decls) != 2 {
		t.Errorf("the provisioner was called %d times, want 2", len(prov.decls))
	}
}
