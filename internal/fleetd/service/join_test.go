package service_test

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/storefault"
	"github.com/nodetrust/nodetrust/pki"
)

func TestTokenJoinSignsAndSpendsTheToken(t *testing.T) {
	e := newEnv(t)
	secret, tokID := e.token(t, &adminv1.CreateTokenRequest{Role: "worker", Site: "fra1"})
	m := newMachine(t, "Web-01.example.com")
	m.claims.ProductSerial, m.claims.Macs = "SN-1", []string{"02:00:00:00:00:01"}
	resp, err := e.join.Join(t.Context(), e.request(t, m, secret))
	if err != nil {
		t.Fatalf("Join: %v", err)
	}
	o := e.open(t, resp.GetSigned(), m.csrHash, m.key.Public())
	now := e.clock.Now()

	r := o.Result
	if r.NodeId != "web-01" || r.Role != "worker" || r.Site != "fra1" || r.IdentityGeneration != 1 {
		t.Errorf("result names node %q role %q site %q generation %d, want web-01, worker, fra1, 1", r.NodeId, r.Role, r.Site, r.IdentityGeneration)
	}
	if r.SpiffeId != pki.NodeSPIFFEID(trustDomain, "web-01") {
		t.Errorf("SPIFFE ID %q", r.SpiffeId)
	}
	if r.ServerTimeUnixNano != now.UnixNano() {
		t.Errorf("server time %d, want the server clock's %d", r.ServerTimeUnixNano, now.UnixNano())
	}
	if got := o.Leaf.NotAfter; !got.Equal(now.Add(24 * time.Hour)) {
		t.Errorf("leaf NotAfter %s, want the default 24h after %s", got, now)
	}
	if len(r.Roots) != 1 || !bytes.Equal(r.Roots[0], e.auth.Root.Raw) {
		t.Error("the result does not carry the root CA as its trust bundle")
	}

	serial := hex.EncodeToString(o.Leaf.SerialNumber.Bytes())
	n := e.storedNode(t, "web-01")
	if n.State != store.StateActive || n.Generation != 1 || n.CertSerial != serial || n.Attestor != "token" ||
		n.Claims.ProductUUID != m.claims.ProductUuid || n.Claims.Hostname != "Web-01.example.com" || n.DaemonVersion != "test" {
		t.Errorf("stored node %+v", n)
	}
	if c := e.storedCert(t, serial); c.Kind != "join" || c.Generation != 1 || c.NodeID != "web-01" || !c.RevokedAt.IsZero() {
		t.Errorf("stored certificate %+v", c)
	}
	tok := e.storedToken(t, secret)
	if tok.UsedBy != "web-01" || !tok.UsedAt.Equal(now) {
		t.Errorf("token used by %q at %s, want web-01 at %s", tok.UsedBy, tok.UsedAt, now)
	}
	audit := e.audit(t, "join")
	if len(audit) != 1 || audit[0].Actor != "token:"+tokID || audit[0].Subject != "web-01" || !strings.Contains(audit[0].Detail, "serial "+serial) {
		t.Errorf("join audit %+v, want one by token:%s for web-01 naming serial %s", audit, tokID, serial)
	}
	if len(e.logs.find("node joined", "serial", serial)) != 1 {
		t.Error("the join is not logged with its serial")
	}
}

func TestTokenJoinChoosesTheNodeID(t *testing.T) {
	cases := []struct {
		name     string
		token    *adminv1.CreateTokenRequest
		hostname string
		askID    string
		// before joins other machines first.
		before []string
		want   string
	}{
		{name: "the hostname's first label, lower-cased, names the node", token: nil, hostname: "DB_Primary.corp", want: "db-primary"},
		{name: "a machine without a hostname is called node", token: nil, hostname: "", want: "node"},
		{name: "a node id the request asks for is taken when the token names none", token: nil, hostname: "web", askID: "db-7", want: "db-7"},
		{name: "the token's node id wins over the hostname", token: &adminv1.CreateTokenRequest{Role: "worker", NodeId: "gpu-3"}, hostname: "web", want: "gpu-3"},
		{name: "a hostname already taken gets a random suffix", token: nil, hostname: "web", before: []string{"web"}, want: "web-"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			for _, h := range tc.before {
				e.newNode(t, h)
			}
			secret, _ := e.token(t, tc.token)
			m := newMachine(t, tc.hostname)
			req := e.request(t, m, secret)
			req.NodeId = tc.askID
			n := e.mustJoin(t, m, req)
			if strings.HasSuffix(tc.want, "-") {
				if !strings.HasPrefix(n.id, tc.want) || len(n.id) != len(tc.want)+6 {
					t.Fatalf("node id %q, want %s and 6 hex digits", n.id, tc.want)
				}
			} else if n.id != tc.want {
				t.Fatalf("node id %q, want %q", n.id, tc.want)
			}
			if got := e.storedNode(t, n.id); got.Generation != 1 {
				t.Errorf("generation %d, want 1", got.Generation)
			}
		})
	}
}

func TestRamdiskCertificatesLiveTwoHours(t *testing.T) {
	e := newEnv(t)
	secret, _ := e.token(t, &adminv1.CreateTokenRequest{Role: "ramdisk"})
	m := newMachine(t, "pxe")
	n := e.mustJoin(t, m, e.request(t, m, secret))
	if got, want := n.leaf.Leaf.NotAfter, e.clock.Now().Add(service.RamdiskMaxLifetime); !got.Equal(want) {
		t.Fatalf("ramdisk leaf NotAfter %s, want %s", got, want)
	}
}

func TestReclaim(t *testing.T) {
	cases := []struct {
		name  string
		token *adminv1.CreateTokenRequest
		// sameMachine: the second join comes from the first node's machine
		// (same product UUID); otherwise from a new one.
		sameMachine bool
		askID       string
		wantRefusal string
	}{
		{
			name:        "a known machine with a token that does not allow reclaim is refused",
			token:       &adminv1.CreateTokenRequest{Role: "worker"},
			sameMachine: true,
			wantRefusal: "machine is already known as node web (same product UUID or serial); the token does not allow reclaim",
		},
		{
			name:        "a known machine is reclaimed with a token that allows it",
			token:       &adminv1.CreateTokenRequest{Role: "worker", AllowReclaim: true},
			sameMachine: true,
		},
		{
			name:        "a known machine that asks for another node id is refused",
			token:       &adminv1.CreateTokenRequest{Role: "worker", AllowReclaim: true},
			sameMachine: true,
			askID:       "db",
			wantRefusal: "machine is known as node web, the join asks for node db",
		},
		{
			name:        "a new machine cannot take a node id in use",
			token:       &adminv1.CreateTokenRequest{Role: "worker", NodeId: "web"},
			wantRefusal: "node id web is taken by another machine",
		},
		{
			name:  "a new machine reclaims a node id with a token for that node that allows reclaim",
			token: &adminv1.CreateTokenRequest{Role: "worker", NodeId: "web", AllowReclaim: true},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			first := newMachine(t, "web")
			s1, _ := e.token(t, nil)
			old := e.mustJoin(t, first, e.request(t, first, s1))

			m := newMachine(t, "web")
			if tc.sameMachine {
				m.claims = first.claims
			}
			secret, tokID := e.token(t, tc.token)
			req := e.request(t, m, secret)
			req.NodeId = tc.askID
			resp, err := e.join.Join(t.Context(), req)
			if tc.wantRefusal != "" {
				wantRefused(t, e, err, tc.wantRefusal, tokID)
				if n := e.storedNode(t, "web"); n.Generation != 1 || n.CertSerial != old.serial() {
					t.Errorf("the refused join changed node web: %+v", n)
				}
				return
			}
			if err != nil {
				t.Fatalf("Join: %v", err)
			}
			o := e.open(t, resp.GetSigned(), m.csrHash, m.key.Public())
			if o.Result.NodeId != "web" || o.Result.IdentityGeneration != 2 {
				t.Fatalf("reclaim made node %s generation %d, want web generation 2", o.Result.NodeId, o.Result.IdentityGeneration)
			}
			if c := e.storedCert(t, old.serial()); c.RevokedAt.IsZero() || c.RevokedReason != "reclaimed" {
				t.Errorf("the old certificate is %+v, want it revoked as reclaimed", c)
			}
			if a := e.audit(t, "join"); len(a) != 2 || !strings.Contains(a[0].Detail, "generation 2 reclaim true") {
				t.Errorf("join audit %+v, want the reclaim on top", a)
			}
		})
	}
}

// wantRefused checks a refused join: the one wire answer, the reason in
// the log and, when tokID is set, in the audit trail as well.
func wantRefused(t *testing.T, e *env, err error, reason, tokID string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != codes.PermissionDenied || st.Message() != service.JoinRefused {
		t.Fatalf("error = %v, want PERMISSION_DENIED %q", err, service.JoinRefused)
	}
	if len(e.logs.find("join refused", "reason", reason)) == 0 {
		t.Errorf("no %q in the log's refusals", reason)
	}
	audited := false
	for _, a := range e.audit(t, "join.refused") {
		if strings.Contains(a.Detail, reason) {
			audited = true
			if a.Subject != "token:"+tokID || a.Actor != "join" {
				t.Errorf("refusal audited as %+v, want subject token:%s", a, tokID)
			}
		}
	}
	if audited != (tokID != "") {
		t.Errorf("refusal %q audited = %t, want %t", reason, audited, tokID != "")
	}
}

func TestJoinRefusals(t *testing.T) {
	cases := []struct {
		name  string
		tweak func(*service.Config)
		token *adminv1.CreateTokenRequest
		// before prepares the server for the join with secret.
		before func(t *testing.T, e *env, secret string)
		// edit changes the request of machine m.
		edit   func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string)
		reason string
		// audited: the token opened, so the refusal is in the audit trail.
		audited bool
	}{
		{
			name: "an unknown token",
			edit: func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) {
				req.SealedToken = e.seal(t, m.csrHash, "ntjt_unknown")
			},
			reason: "unknown token",
		},
		{
			name: "a token another node spent",
			before: func(t *testing.T, e *env, secret string) {
				other := newMachine(t, "first")
				e.mustJoin(t, other, e.request(t, other, secret))
			},
			reason:  "token already used by node first at ",
			audited: true,
		},
		{
			name:    "a token at the instant it expires",
			token:   &adminv1.CreateTokenRequest{Role: "worker", TtlSeconds: 60},
			before:  func(t *testing.T, e *env, _ string) { e.clock.Advance(time.Minute) },
			reason:  "token expired at ",
			audited: true,
		},
		{
			name:    "a token for another role",
			edit:    func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) { req.Role = "gpu" },
			reason:  `token is for role "worker", the request asks for role "gpu"`,
			audited: true,
		},
		{
			name:    "a token for another node id",
			token:   &adminv1.CreateTokenRequest{Role: "worker", NodeId: "node-a"},
			edit:    func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) { req.NodeId = "node-b" },
			reason:  `token is for node "node-a", the request asks for node "node-b"`,
			audited: true,
		},
		{
			name:    "a node id that is not valid",
			edit:    func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) { req.NodeId = "Node_A" },
			reason:  "requested node id",
			audited: true,
		},
		{
			name: "a token sealed for another CSR",
			edit: func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) {
				other := newMachine(t, "other")
				req.SealedToken = e.seal(t, other.csrHash, secret)
			},
			reason: "sealed token does not open for this CSR",
		},
		{
			name: "a token that is not sealed at all",
			edit: func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) {
				req.SealedToken = []byte("ntjt_plain")
			},
			reason: "sealed token does not open for this CSR",
		},
		{
			name:   "a request without a CSR",
			edit:   func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) { req.Csr = nil },
			reason: "CSR missing or larger than 4096 bytes",
		},
		{
			name: "a CSR larger than 4 KiB",
			edit: func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) {
				req.Csr = make([]byte, 4097)
			},
			reason: "CSR missing or larger than 4096 bytes",
		},
		{
			name: "a CSR that does not parse",
			edit: func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) {
				req.Csr = []byte("not DER")
			},
			reason: "bad CSR",
		},
		{
			name:   "a request that names no attestor",
			edit:   func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) { req.Attestor = "" },
			reason: "no attestor named",
		},
		{
			name: "an attestor the server does not have",
			edit: func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) {
				req.Attestor = "x509pop"
			},
			reason: `attestor "x509pop" is not supported`,
		},
		{
			name: "the tpm attestor without evidence",
			edit: func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) {
				req.Attestor, req.SealedToken = "tpm", nil
			},
			reason: "tpm attestor without TPM evidence",
		},
		{
			name: "the tpm attestor with an EK that does not parse",
			edit: func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) {
				req.Attestor, req.Tpm = "tpm", &joinv1.TpmEvidence{EkPublic: []byte{1, 2, 3}}
			},
			reason: "EK public area",
		},
		{
			name: "an answer to a tpm challenge the server never sent",
			edit: func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) {
				req.Attestor, req.DeferralId = "tpm", "0123456789abcdef"
			},
			// The request carries its token, which opens: audited.
			reason:  "unknown deferral (or a challenge already answered)",
			audited: true,
		},
		{
			name: "an answer to a tpm challenge the server never sent, without a token",
			edit: func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) {
				req.Attestor, req.DeferralId, req.SealedToken = "tpm", "0123456789abcdef", nil
			},
			reason: "unknown or already answered challenge",
		},
		{
			name: "a deferral id with a token that needs no approval",
			edit: func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) {
				req.DeferralId = "0123456789abcdef"
			},
			reason:  "a deferral id for a token that needs no approval",
			audited: true,
		},
		{
			name:  "a deferral id the server never gave",
			token: &adminv1.CreateTokenRequest{Role: "worker", RequireApproval: true},
			edit: func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) {
				req.DeferralId = "0123456789abcdef"
			},
			reason:  "unknown deferral",
			audited: true,
		},
		{
			name:    "a join that loses the race for its token or node id",
			before:  func(t *testing.T, e *env, _ string) { e.store.FailNext("CompleteJoin", store.ErrConflict) },
			reason:  "token or node id was taken by a concurrent join",
			audited: true,
		},
		{
			name:    "a refusal whose audit entry the store cannot write",
			token:   &adminv1.CreateTokenRequest{Role: "worker", NodeId: "node-a"},
			before:  func(t *testing.T, e *env, _ string) { e.store.FailNext("AppendAudit", storefault.ErrInjected) },
			edit:    func(t *testing.T, e *env, m *machine, req *joinv1.JoinRequest, secret string) { req.NodeId = "node-b" },
			reason:  `token is for node "node-a"`,
			audited: false,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var tweaks []func(*service.Config)
			if tc.tweak != nil {
				tweaks = append(tweaks, tc.tweak)
			}
			e := newEnv(t, tweaks...)
			secret, tokID := e.token(t, tc.token)
			if tc.before != nil {
				tc.before(t, e, secret)
			}
			nodesBefore := len(e.nodes(t))
			m := newMachine(t, "refused")
			req := e.request(t, m, secret)
			if tc.edit != nil {
				tc.edit(t, e, m, req, secret)
			}
			_, err := e.join.Join(t.Context(), req)
			if !tc.audited {
				tokID = ""
			}
			wantRefused(t, e, err, tc.reason, tokID)
			e.wantFired(t)
			if got := len(e.nodes(t)); got != nodesBefore {
				t.Errorf("%d nodes after the refusal, want %d", got, nodesBefore)
			}
		})
	}
}

// TestJoinStoreFailures fails each store call a token join makes in turn:
// the node is told UNAVAILABLE (retry), nothing is written, and the same
// request succeeds once the store is back.
func TestJoinStoreFailures(t *testing.T) {
	cases := []struct {
		name   string
		method string
		token  *adminv1.CreateTokenRequest
		askID  string
		// approvalPoll: the failing request is the poll of a pending
		// join, after a first request that made it.
		approvalPoll bool
		wantPending  bool
	}{
		{name: "the token look-up fails", method: "TokenByHash"},
		{name: "the look-up of known machines fails", method: "NodesByClaims"},
		{name: "the look-up of the hostname's node id fails", method: "GetNode"},
		{name: "the look-up of the node id asked for fails", method: "GetNode", askID: "db-1"},
		{name: "the next generation of a new node fails", method: "NextGeneration"},
		{name: "recording the join fails", method: "CompleteJoin"},
		{name: "storing a join that waits for approval fails", method: "CreatePending",
			token: &adminv1.CreateTokenRequest{Role: "worker", RequireApproval: true}, wantPending: true},
		{name: "reading the pending join a poll names fails", method: "GetPending",
			token: &adminv1.CreateTokenRequest{Role: "worker", RequireApproval: true}, approvalPoll: true, wantPending: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			secret, _ := e.token(t, tc.token)
			m := newMachine(t, "web")
			req := e.request(t, m, secret)
			req.NodeId = tc.askID
			pendingBefore := 0
			if tc.approvalPoll {
				resp, err := e.join.Join(t.Context(), req)
				if err != nil || resp.GetPending() == nil {
					t.Fatalf("first request: %v %v, want a pending join", resp, err)
				}
				req.DeferralId = resp.GetPending().DeferralId
				pendingBefore = 1
			}
			e.store.FailNext(tc.method, storefault.ErrInjected)
			auditBefore := len(e.audit(t, "join"))

			_, err := e.join.Join(t.Context(), req)
			wantStatus(t, err, codes.Unavailable, "join could not be completed; retry later (request ")
			e.wantFired(t)
			if len(e.logs.find("join failed", "error", storefault.ErrInjected.Error())) != 1 {
				t.Error("the store failure is not logged as join failed")
			}
			if ids := e.nodes(t); len(ids) != 0 {
				t.Errorf("nodes %v after a failed join, want none", ids)
			}
			if tok := e.storedToken(t, secret); !tok.UsedAt.IsZero() {
				t.Errorf("the failed join spent the token: %+v", tok)
			}
			if got := len(e.audit(t, "join")); got != auditBefore {
				t.Errorf("%d join audit entries, want %d", got, auditBefore)
			}
			if ps, _ := e.db.ListPending(t.Context(), e.clock.Now()); len(ps) != pendingBefore {
				t.Errorf("%d pending joins, want %d", len(ps), pendingBefore)
			}

			resp, err := e.join.Join(t.Context(), req)
			switch {
			case err != nil:
				t.Fatalf("the same request once the store is back: %v", err)
			case tc.wantPending && resp.GetPending() == nil, !tc.wantPending && resp.GetSigned() == nil:
				t.Fatalf("the same request once the store is back answered %T", resp.Result)
			}
		})
	}
}

func TestApprovalFlow(t *testing.T) {
	e := newEnv(t, func(c *service.Config) { c.PendingPoll = 1500 * time.Millisecond })
	secret, tokID := e.token(t, &adminv1.CreateTokenRequest{Role: "worker", RequireApproval: true})
	m := newMachine(t, "web")
	req := e.request(t, m, secret)

	resp, err := e.join.Join(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	p := resp.GetPending()
	if p == nil || p.DeferralId == "" || p.RetryAfterMs != 1500 || !strings.Contains(p.Message, "fleetd nodes approve web") {
		t.Fatalf("first answer %v, want a pending join for web polled every 1.5 s", resp)
	}
	list, err := e.admin.ListPending(t.Context(), &adminv1.ListPendingRequest{})
	if err != nil || len(list.Pending) != 1 || list.Pending[0].NodeId != "web" || list.Pending[0].TokenId != tokID || list.Pending[0].Approved {
		t.Fatalf("ListPending = %v, %v; want web's unapproved join", list, err)
	}

	// A poll before the approval waits again, on the same deferral.
	req.DeferralId = p.DeferralId
	resp, err = e.join.Join(t.Context(), req)
	if err != nil || resp.GetPending().GetDeferralId() != p.DeferralId {
		t.Fatalf("poll before approval: %v %v, want the same pending join", resp, err)
	}

	// The deferral is bound to the CSR it was made for.
	other := newMachine(t, "web")
	stolen := e.request(t, other, secret)
	stolen.DeferralId = p.DeferralId
	_, err = e.join.Join(t.Context(), stolen)
	wantRefused(t, e, err, "the deferral belongs to another request", tokID)

	approved, err := e.admin.ApproveNode(t.Context(), &adminv1.ApproveNodeRequest{Id: "web"})
	if err != nil || approved.Approved != 1 {
		t.Fatalf("ApproveNode = %v, %v; want 1 approved", approved, err)
	}
	if a := e.audit(t, "node.approve"); len(a) != 1 || a[0].Actor != "admin:"+pki.OwnerName || a[0].Subject != "web" {
		t.Errorf("approval audit %+v", a)
	}
	if list, _ := e.admin.ListPending(t.Context(), &adminv1.ListPendingRequest{}); len(list.GetPending()) != 1 || !list.Pending[0].Approved {
		t.Errorf("ListPending after approval = %v, want web's join approved", list)
	}

	n := e.mustJoin(t, m, req)
	if n.id != "web" || n.gen != 1 {
		t.Fatalf("approved join made node %s generation %d", n.id, n.gen)
	}
	if tok := e.storedToken(t, secret); tok.UsedBy != "web" {
		t.Errorf("token used by %q, want web", tok.UsedBy)
	}
	if list, _ := e.admin.ListPending(t.Context(), &adminv1.ListPendingRequest{}); len(list.GetPending()) != 0 {
		t.Errorf("ListPending after the join = %v, want none", list)
	}
	_, err = e.admin.ApproveNode(t.Context(), &adminv1.ApproveNodeRequest{Id: "web"})
	wantStatus(t, err, codes.NotFound, "no join of node web is waiting for approval")
}
