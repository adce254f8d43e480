//go:build tpmsim

package service_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/fleetd/actuator"
	"github.com/nodetrust/nodetrust/internal/fleetd/bootpolicy"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// Boot policy wired into tpm joins, attested renewals and boot checks on
// the live session, against the reference simulator: the simulator's PCRs
// are never extended, so an empty log replays (every quoted PCR holds its
// initial value) and a log with events does not — a TPM-proven false
// account of the boot, which fails rule event_log.

// permissivePolicies writes a policy per default class that accepts a
// boot without Secure Boot, and returns the loaded policies.
func permissivePolicies(t *testing.T, secureBootFor ...string) *bootpolicy.Policies {
	t.Helper()
	dir := t.TempDir()
	for _, class := range []string{"worker", "control-plane", "install-environment"} {
		sb := "false"
		for _, c := range secureBootFor {
			if c == class {
				sb = "true\n[[allowed_authorities]]\nname = \"x\"\nsha256 = \"" + strings.Repeat("ab", 32) + "\""
			}
		}
		if err := os.WriteFile(filepath.Join(dir, class+".toml"), []byte("class = \""+class+"\"\nsecure_boot = "+sb+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	ps, err := bootpolicy.Load(bootpolicy.Config{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// falseLog is a measurement log the simulator's PCRs do not replay to.
func falseLog() []byte {
	var l tpmtest.EventLog
	l.SecureBootVariables(false, nil, nil, nil, nil)
	l.Separators(0, 1, 2, 3, 4, 5, 6, 7)
	return l.Bytes()
}

// cordonReceiver is a fake webhook receiver standing in for the operator's
// automation: it records the cordons fleetd requests.
func cordonReceiver(t *testing.T) (actuator.Actuator, chan actuator.Cordon) {
	t.Helper()
	got := make(chan actuator.Cordon, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var c actuator.Cordon
		if err := json.NewDecoder(r.Body).Decode(&c); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		got <- c
	}))
	t.Cleanup(srv.Close)
	a, err := actuator.NewWebhook(actuator.WebhookConfig{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return a, got
}

// bootEnv is a server with boot policy, a verdict log and a webhook
// actuator, and a TPM node joined to it.
type bootEnv struct {
	*env
	m       *tpmMachine
	n       *node
	cordons chan actuator.Cordon
	vlog    *bootpolicy.VerdictLog
}

func newBootEnv(t *testing.T, tweak ...func(*service.Config)) *bootEnv {
	t.Helper()
	m, roots := newTPMMachine(t)
	vdir := t.TempDir()
	vlog, err := bootpolicy.OpenVerdictLog(bootpolicy.VerdictLogConfig{Dir: vdir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { vlog.Close() })
	act, cordons := cordonReceiver(t)
	ps := permissivePolicies(t)
	e2 := newEnv(t, append([]func(*service.Config){func(c *service.Config) {
		c.EKVerifier = mustVerifier(t, roots)
		c.BootPolicy, c.VerdictLog, c.Actuator, c.BootCheckTimeout = ps, vlog, act, 2*time.Second
	}}, tweak...)...)
	secret, _ := e2.token(t, nil)
	n := tpmJoin(t, e2, m, secret)
	return &bootEnv{env: e2, m: m, n: n, cordons: cordons, vlog: vlog}
}

// session opens n's live session and returns it after the welcome.
func (b *bootEnv) session(t *testing.T, ctx context.Context) gatewayv1.Gateway_SessionClient {
	t.Helper()
	_, gw := b.nodeClients(t, b.n)
	st, err := gw.Session(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{InstanceId: "test"}}}); err != nil {
		t.Fatal(err)
	}
	if w, err := st.Recv(); err != nil || w.GetWelcome() == nil {
		t.Fatalf("session welcome: %v %v", w, err)
	}
	return st
}

// evidence quotes the simulator's boot PCRs with the node's AK over nonce.
func (b *bootEnv) evidence(t *testing.T, nonce, log []byte) *gatewayv1.BootEvidence {
	t.Helper()
	q, sig, values, err := b.m.tp.Quote(t.Context(), b.m.ak, nonce, tpm.BootPCRs)
	if err != nil {
		t.Fatal(err)
	}
	pcrs := map[uint32][]byte{}
	for i, v := range values {
		pcrs[uint32(i)] = v
	}
	return &gatewayv1.BootEvidence{Nonce: nonce, AkPublic: b.m.ak.PublicArea(), QuoteAttest: q, QuoteSignature: sig, Pcrs: pcrs, EventLog: log}
}

// check runs fleetd nodes check against the session: answer turns the
// nonce the server sends into the message the node sends back (nil: none).
func (b *bootEnv) check(t *testing.T, st gatewayv1.Gateway_SessionClient, answer func(nonce []byte) *gatewayv1.SessionRequest) (*adminv1.CheckNodeResponse, error) {
	t.Helper()
	type result struct {
		resp *adminv1.CheckNodeResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		r, err := b.admin.CheckNode(context.Background(), &adminv1.CheckNodeRequest{NodeId: b.n.id})
		done <- result{r, err}
	}()
	m, err := st.Recv()
	if err != nil || m.GetNonce() == nil {
		t.Fatalf("the session got %v, %v; want a nonce", m, err)
	}
	if m.GetNonce().Purpose != gatewayv1.NoncePurpose_NONCE_PURPOSE_BOOT_CHECK || len(m.GetNonce().Nonce) != 32 {
		t.Fatalf("nonce %v", m.GetNonce())
	}
	if req := answer(m.GetNonce().Nonce); req != nil {
		req.Id = m.Id
		if err := st.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	r := <-done
	return r.resp, r.err
}

func evidenceMsg(ev *gatewayv1.BootEvidence) *gatewayv1.SessionRequest {
	return &gatewayv1.SessionRequest{Body: &gatewayv1.SessionRequest_BootEvidence{BootEvidence: ev}}
}

func randomBytes(t *testing.T) []byte {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func (b *bootEnv) verdicts(t *testing.T) []*adminv1.Verdict {
	t.Helper()
	r, err := b.admin.ListVerdicts(t.Context(), &adminv1.ListVerdictsRequest{NodeId: b.n.id})
	if err != nil {
		t.Fatal(err)
	}
	return r.Verdicts
}

func TestSimBootCheck(t *testing.T) {
	cases := []struct {
		name string
		// answer is what the node sends for the nonce (nil: nothing).
		answer     func(t *testing.T, b *bootEnv, nonce []byte) *gatewayv1.SessionRequest
		wantCode   codes.Code // of CheckNode; OK for a verdict
		wantAction string
		wantState  string
		wantIgnore string // the reason counted when nothing was evidence
	}{
		{"a boot the policy accepts changes nothing", func(t *testing.T, b *bootEnv, n []byte) *gatewayv1.SessionRequest {
			return evidenceMsg(b.evidence(t, n, nil))
		}, codes.OK, "none", store.StateActive, ""},
		{"a TPM-proven false log quarantines a worker and requests its cordon", func(t *testing.T, b *bootEnv, n []byte) *gatewayv1.SessionRequest {
			return evidenceMsg(b.evidence(t, n, falseLog()))
		}, codes.OK, "quarantined", store.StateQuarantined, ""},
		{"a quote over another nonce is not evidence", func(t *testing.T, b *bootEnv, n []byte) *gatewayv1.SessionRequest {
			ev := b.evidence(t, randomBytes(t), falseLog())
			ev.Nonce = n
			return evidenceMsg(ev)
		}, codes.Unavailable, "", store.StateActive, "unproven"},
		{"a quote by another AK is not evidence", func(t *testing.T, b *bootEnv, n []byte) *gatewayv1.SessionRequest {
			ak, _, err := b.m.tp.NewAK(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer ak.Close()
			q, sig, values, err := b.m.tp.Quote(t.Context(), ak, n, tpm.BootPCRs)
			if err != nil {
				t.Fatal(err)
			}
			pcrs := map[uint32][]byte{}
			for i, v := range values {
				pcrs[uint32(i)] = v
			}
			return evidenceMsg(&gatewayv1.BootEvidence{Nonce: n, AkPublic: ak.PublicArea(), QuoteAttest: q, QuoteSignature: sig, Pcrs: pcrs, EventLog: falseLog()})
		}, codes.Unavailable, "", store.StateActive, "wrong_ak"},
		{"a node that cannot quote gives no evidence", func(t *testing.T, b *bootEnv, n []byte) *gatewayv1.SessionRequest {
			return evidenceMsg(&gatewayv1.BootEvidence{Nonce: n, Error: "quote the boot PCRs: TPM_RC_FAILURE"})
		}, codes.Unavailable, "", store.StateActive, "node_error"},
		{"an unanswered nonce is not evidence", func(*testing.T, *bootEnv, []byte) *gatewayv1.SessionRequest { return nil },
			codes.Unavailable, "", store.StateActive, "timeout"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := newBootEnv(t)
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			st := b.session(t, ctx)
			resp, err := b.check(t, st, func(n []byte) *gatewayv1.SessionRequest { return c.answer(t, b, n) })
			if c.wantCode != codes.OK {
				wantStatus(t, err, c.wantCode, "nothing changed")
				if got := b.metric(t, `nodetrust_boot_evidence_ignored_total{reason="`+c.wantIgnore+`"}`); !strings.HasSuffix(got, " 1") {
					t.Errorf("ignored evidence counted %q, want reason %s once", got, c.wantIgnore)
				}
				// The join's intake verdict went to verdicts.jsonl alone:
				// the machine had no node id yet.
				if vs := b.verdicts(t); len(vs) != 0 {
					t.Errorf("verdicts %v: want none", vs)
				}
			} else {
				if err != nil {
					t.Fatalf("CheckNode: %v", err)
				}
				if resp.Action != c.wantAction || resp.Verdict.Stage != "boot-check" || resp.Verdict.Class != "worker" {
					t.Errorf("CheckNode = %v", resp)
				}
				vs := b.verdicts(t)
				if len(vs) != 1 || vs[0].Stage != "boot-check" || vs[0].Passed != resp.Verdict.Passed || len(vs[0].NonceSha256) != 64 || len(vs[0].QuoteSha256) != 64 {
					t.Errorf("stored verdicts %v", vs)
				}
			}
			if got := b.storedNode(t, b.n.id).State; got != c.wantState {
				t.Errorf("state %s, want %s", got, c.wantState)
			}
			if c.wantState == store.StateQuarantined {
				cordon := <-b.cordons
				if cordon.Action != "cordon" || cordon.NodeID != b.n.id || !strings.Contains(cordon.Reason, "event_log") {
					t.Errorf("cordon %+v", cordon)
				}
				if h := b.audit(t, "node.quarantine"); len(h) != 1 || h[0].Actor != "bootpolicy" || !strings.Contains(h[0].Detail, "event_log") {
					t.Errorf("quarantine audit %v", h)
				}
				log, err := os.ReadFile(b.vlog.Path())
				if err != nil || strings.Count(string(log), "\n") != 2 || !strings.Contains(string(log), `"result":"fail"`) {
					t.Errorf("verdicts.jsonl:\n%s %v", log, err)
				}
			} else if len(b.cordons) != 0 {
				t.Errorf("a cordon was requested: %v", <-b.cordons)
			}
		})
	}
}

func TestSimBootCheckOfAControlPlaneOnlyAlerts(t *testing.T) {
	// The node is undeclared (class worker); configured as a
	// control-plane class, its failure only alerts.
	b := newBootEnv(t, func(c *service.Config) { c.ControlPlaneClasses = []string{"worker"} })
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st := b.session(t, ctx)
	resp, err := b.check(t, st, func(n []byte) *gatewayv1.SessionRequest { return evidenceMsg(b.evidence(t, n, falseLog())) })
	if err != nil || resp.Action != "alerted" || resp.Verdict.Passed {
		t.Fatalf("CheckNode = %v, %v; want a failed verdict, alerted", resp, err)
	}
	if got := b.storedNode(t, b.n.id).State; got != store.StateActive {
		t.Errorf("state %s, want active", got)
	}
	if got := b.metric(t, `nodetrust_boot_alerts_total{class="worker"}`); !strings.HasSuffix(got, " 1") {
		t.Errorf("alert metric %q", got)
	}
	if len(b.logs.find("ALERT: a control-plane machine failed its boot policy; no automatic quarantine: review it and quarantine or retire it by hand", "reason", "event_log")) != 1 {
		t.Error("no alert log line naming the failed rule")
	}
	if len(b.cordons) != 0 {
		t.Error("a control-plane failure requested a cordon")
	}
}

func TestSimBootCheckSessionEnds(t *testing.T) {
	b := newBootEnv(t)
	ctx, cancel := context.WithCancel(t.Context())
	st := b.session(t, ctx)
	_, err := b.check(t, st, func([]byte) *gatewayv1.SessionRequest {
		cancel() // the session drops with the nonce open
		return nil
	})
	wantStatus(t, err, codes.Unavailable, "nothing changed")
	if got := b.storedNode(t, b.n.id).State; got != store.StateActive {
		t.Errorf("state %s after a dropped session, want active", got)
	}
	if got := b.metric(t, `nodetrust_boot_evidence_ignored_total{reason="session_ended"}`); !strings.HasSuffix(got, " 1") {
		t.Errorf("session_ended counted %q", got)
	}
	t.Run("a check of a node without a live session fails at once", func(t *testing.T) {
		_, err := b.admin.CheckNode(t.Context(), &adminv1.CheckNodeRequest{NodeId: b.n.id})
		wantStatus(t, err, codes.Unavailable, "no live session")
	})
}

func TestSimBootEvidenceOverAnUnknownNonceIsNotEvaluated(t *testing.T) {
	b := newBootEnv(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	st := b.session(t, ctx)
	n := randomBytes(t)
	if err := st.Send(&gatewayv1.SessionRequest{Id: 7, Body: &gatewayv1.SessionRequest_BootEvidence{BootEvidence: b.evidence(t, n, falseLog())}}); err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	if err != nil || m.Id != 7 || m.GetBootResult().GetResult() != "not-evaluated" {
		t.Fatalf("answer %v, %v", m, err)
	}
	if got := b.storedNode(t, b.n.id).State; got != store.StateActive {
		t.Errorf("state %s, want active", got)
	}
}

// renewOnSession renews b.n on st, with evidence over a renewal nonce
// when log is not nil (withEvidence), and returns the answer.
func (b *bootEnv) renewOnSession(t *testing.T, st gatewayv1.Gateway_SessionClient, withEvidence bool, log []byte) *gatewayv1.SessionResponse {
	t.Helper()
	key, csr, csrHash := b.m.newKey(t)
	now := b.clock.Now().UnixNano()
	proof, err := pki.SignRenewProof(b.n.key, csrHash, now)
	if err != nil {
		t.Fatal(err)
	}
	att, sig, err := b.m.tp.Certify(t.Context(), b.m.ak, key, csrHash)
	if err != nil {
		t.Fatal(err)
	}
	keyPublic := key.PublicArea()
	_ = key.Close() // the simulator has few object slots
	req := &joinv1.RenewRequest{Csr: csr, Chain: b.n.chain, ClientTimeUnixNano: now, Proof: proof,
		KeyAttestation: &joinv1.KeyAttestation{AkPublic: b.m.ak.PublicArea(), KeyPublic: keyPublic, CertifyAttest: att, CertifySignature: sig}}
	msg := &gatewayv1.SessionRequest{Id: 20, Body: &gatewayv1.SessionRequest_Renew{Renew: req}}
	if withEvidence {
		if err := st.Send(&gatewayv1.SessionRequest{Id: 19, Body: &gatewayv1.SessionRequest_NonceRequest{NonceRequest: &gatewayv1.NonceRequest{Purpose: gatewayv1.NoncePurpose_NONCE_PURPOSE_RENEWAL}}}); err != nil {
			t.Fatal(err)
		}
		m, err := st.Recv()
		if err != nil || m.Id != 19 || m.GetNonce() == nil {
			t.Fatalf("nonce answer %v, %v", m, err)
		}
		msg.Body = &gatewayv1.SessionRequest_AttestedRenew{AttestedRenew: &gatewayv1.AttestedRenew{Renew: req, Evidence: b.evidence(t, m.GetNonce().Nonce, log)}}
	}
	if err := st.Send(msg); err != nil {
		t.Fatal(err)
	}
	m, err := st.Recv()
	if err != nil || m.Id != 20 {
		t.Fatalf("renewal answer %v, %v", m, err)
	}
	return m
}

func TestSimAttestedRenewal(t *testing.T) {
	t.Run("a renewal with a boot the policy accepts is issued", func(t *testing.T) {
		b := newBootEnv(t)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		m := b.renewOnSession(t, b.session(t, ctx), true, nil)
		if m.GetRenew().GetSigned() == nil {
			t.Fatalf("renewal answer %v", m)
		}
		if vs := b.verdicts(t); len(vs) != 1 || vs[0].Stage != "renewal" || !vs[0].Passed {
			t.Errorf("verdicts %v", vs)
		}
	})
	t.Run("a renewal without a quote waits", func(t *testing.T) {
		b := newBootEnv(t)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		m := b.renewOnSession(t, b.session(t, ctx), false, nil)
		if e := m.GetError(); e == nil || codes.Code(e.Code) != codes.FailedPrecondition || !strings.Contains(e.Message, "fresh nonce") {
			t.Fatalf("renewal answer %v", m)
		}
		if got := b.storedNode(t, b.n.id).State; got != store.StateActive {
			t.Errorf("state %s, want active", got)
		}
	})
	t.Run("a renewal whose boot fails is refused and the worker quarantined", func(t *testing.T) {
		b := newBootEnv(t)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		st := b.session(t, ctx)
		m := b.renewOnSession(t, st, true, falseLog())
		if e := m.GetError(); e == nil || codes.Code(e.Code) != codes.PermissionDenied || !strings.Contains(e.Message, "event_log") {
			t.Fatalf("renewal answer %v", m)
		}
		if got := b.storedNode(t, b.n.id).State; got != store.StateQuarantined {
			t.Errorf("state %s, want quarantined", got)
		}
		m = b.renewOnSession(t, st, true, nil)
		if e := m.GetError(); e == nil || codes.Code(e.Code) != codes.FailedPrecondition || !strings.Contains(e.Message, "quarantined") {
			t.Fatalf("renewal of a quarantined node: %v", m)
		}
	})
}

func TestSimTPMJoinRefusedByBootPolicy(t *testing.T) {
	m, roots := newTPMMachine(t)
	e := newEnv(t, func(c *service.Config) {
		c.EKVerifier = mustVerifier(t, roots)
		c.BootPolicy = permissivePolicies(t, "worker") // the worker needs Secure Boot
	})
	secret, _ := e.token(t, nil)
	req := m.request(t, e, secret)
	ch := challenge(t, e, req)
	req.DeferralId, req.Answer = ch.DeferralId, m.answer(t, ch)
	_, err := e.join.Join(t.Context(), req)
	wantStatus(t, err, codes.PermissionDenied, service.JoinRefused)
	if len(e.logs.find("join refused", "reason", "secure_boot: required, but the log does not measure PCR 7")) != 1 {
		t.Error("the server log does not name the failed rule")
	}
	if a := e.audit(t, "join.boot_refused"); len(a) != 1 || !strings.Contains(a[0].Detail, "secure_boot") || !strings.Contains(a[0].Subject, "ek:sha256:") {
		t.Errorf("audit %v", a)
	}
	if got := e.nodes(t); len(got) != 0 {
		t.Errorf("nodes %v after a refused join", got)
	}
}

func mustVerifier(t *testing.T, roots *x509.CertPool) *attest.Verifier {
	t.Helper()
	v, err := attest.New(attest.Config{Roots: roots})
	if err != nil {
		t.Fatal(err)
	}
	return v
}
