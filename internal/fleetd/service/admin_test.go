package service_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/storefault"
	"github.com/nodetrust/nodetrust/pki"
)

// adminCalls calls each Admin method once with a harmless request.
var adminCalls = []struct {
	method string
	call   func(ctx context.Context, c adminv1.AdminClient) error
}{
	{"CreateToken", func(ctx context.Context, c adminv1.AdminClient) error {
		_, err := c.CreateToken(ctx, &adminv1.CreateTokenRequest{Role: "worker"})
		return err
	}},
	{"ListTokens", func(ctx context.Context, c adminv1.AdminClient) error {
		_, err := c.ListTokens(ctx, &adminv1.ListTokensRequest{})
		return err
	}},
	{"ListNodes", func(ctx context.Context, c adminv1.AdminClient) error {
		_, err := c.ListNodes(ctx, &adminv1.ListNodesRequest{})
		return err
	}},
	{"GetNode", func(ctx context.Context, c adminv1.AdminClient) error {
		_, err := c.GetNode(ctx, &adminv1.GetNodeRequest{Id: "web"})
		return err
	}},
	{"RevokeNode", func(ctx context.Context, c adminv1.AdminClient) error {
		_, err := c.RevokeNode(ctx, &adminv1.RevokeNodeRequest{Id: "web", Reason: "test"})
		return err
	}},
	{"DeleteNode", func(ctx context.Context, c adminv1.AdminClient) error {
		_, err := c.DeleteNode(ctx, &adminv1.DeleteNodeRequest{Id: "web"})
		return err
	}},
	{"ApproveNode", func(ctx context.Context, c adminv1.AdminClient) error {
		_, err := c.ApproveNode(ctx, &adminv1.ApproveNodeRequest{Id: "web"})
		return err
	}},
	{"ListPending", func(ctx context.Context, c adminv1.AdminClient) error {
		_, err := c.ListPending(ctx, &adminv1.ListPendingRequest{})
		return err
	}},
	{"ListAudit", func(ctx context.Context, c adminv1.AdminClient) error {
		_, err := c.ListAudit(ctx, &adminv1.ListAuditRequest{Limit: 5})
		return err
	}},
	{"ListCerts", func(ctx context.Context, c adminv1.AdminClient) error {
		_, err := c.ListCerts(ctx, &adminv1.ListCertsRequest{NodeId: "web"})
		return err
	}},
}

func TestAdminNeedsTheAdminCertificate(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(t, "web")
	callers := []struct {
		name string
		cert *tls.Certificate
	}{
		{name: "without a client certificate", cert: nil},
		{name: "with a node certificate", cert: n.tlsCert()},
	}
	for _, caller := range callers {
		client := adminv1.NewAdminClient(e.dial(t, caller.cert))
		for _, c := range adminCalls {
			t.Run(c.method+" "+caller.name+" is refused", func(t *testing.T) {
				err := c.call(t.Context(), client)
				wantStatus(t, err, codes.Unauthenticated, "admin calls need the admin client certificate from 'fleetd init' (admin/owner.crt)")
			})
		}
	}
	// Nothing got through: one token (the node's), the node untouched.
	if ts, _ := e.db.ListTokens(context.Background()); len(ts) != 1 {
		t.Errorf("%d tokens, want the node's one", len(ts))
	}
	if got := e.storedNode(t, n.id); got.State != store.StateActive || got.Generation != 1 {
		t.Errorf("node %+v after refused admin calls", got)
	}
}

func TestCreateTokenValidation(t *testing.T) {
	cases := []struct {
		name string
		req  *adminv1.CreateTokenRequest
		msg  string
	}{
		{name: "a token without a role", req: &adminv1.CreateTokenRequest{}, msg: "a token needs a role (--role)"},
		{name: "a role that is not a valid name", req: &adminv1.CreateTokenRequest{Role: "Worker Role"}, msg: `role "Worker Role"`},
		{name: "a site that is not a valid name", req: &adminv1.CreateTokenRequest{Role: "worker", Site: "FRA 1"}, msg: `site "FRA 1"`},
		{name: "a node id that is not valid", req: &adminv1.CreateTokenRequest{Role: "worker", NodeId: "-web"}, msg: `node id "-web"`},
		{name: "a negative ttl", req: &adminv1.CreateTokenRequest{Role: "worker", TtlSeconds: -1}, msg: "ttl must be positive"},
		{name: "a ttl beyond the longest allowed", req: &adminv1.CreateTokenRequest{Role: "worker", TtlSeconds: 7201}, msg: "ttl 2h0m1s is longer than max_token_ttl (2h0m0s)"},
	}
	e := newEnv(t, func(c *service.Config) { c.MaxTokenTTL = 2 * time.Hour })
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.admin.CreateToken(t.Context(), tc.req)
			wantStatus(t, err, codes.InvalidArgument, tc.msg)
		})
	}
	if ts, _ := e.db.ListTokens(context.Background()); len(ts) != 0 {
		t.Errorf("%d tokens stored, want none", len(ts))
	}
}

func TestCreateToken(t *testing.T) {
	e := newEnv(t, func(c *service.Config) { c.TokenTTL = 90 * time.Minute })
	cases := []struct {
		name    string
		req     *adminv1.CreateTokenRequest
		wantTTL time.Duration
	}{
		{name: "a token without a ttl lives the default ttl", req: &adminv1.CreateTokenRequest{Role: "worker"}, wantTTL: 90 * time.Minute},
		{name: "a token with every option keeps them", req: &adminv1.CreateTokenRequest{Role: "gpu", Site: "fra1", NodeId: "gpu-1", TtlSeconds: 600, AllowReclaim: true, RequireApproval: true}, wantTTL: 10 * time.Minute},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := e.admin.CreateToken(t.Context(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(resp.Token, service.TokenPrefix) {
				t.Errorf("token %q lacks the prefix %s", resp.Token, service.TokenPrefix)
			}
			now := e.clock.Now()
			stored := e.storedToken(t, resp.Token)
			h := sha256.Sum256([]byte(resp.Token))
			switch {
			case !bytes.Equal(stored.Hash, h[:]):
				t.Error("the store does not keep the token's SHA-256")
			case stored.ID != resp.Info.Id, stored.Role != tc.req.Role, stored.Site != tc.req.Site, stored.NodeID != tc.req.NodeId,
				stored.AllowReclaim != tc.req.AllowReclaim, stored.RequireApproval != tc.req.RequireApproval, stored.CreatedBy != pki.OwnerName:
				t.Errorf("stored token %+v for request %v", stored, tc.req)
			case !stored.ExpiresAt.Equal(now.Add(tc.wantTTL)), resp.Info.ExpiresUnix != now.Add(tc.wantTTL).Unix():
				t.Errorf("token expires %s (info %d), want %s", stored.ExpiresAt, resp.Info.ExpiresUnix, now.Add(tc.wantTTL))
			}
			found := false
			for _, a := range e.audit(t, "token.create") {
				found = found || (a.Subject == "token:"+resp.Info.Id && a.Actor == "admin:"+pki.OwnerName && !strings.Contains(a.Detail, resp.Token))
			}
			if !found {
				t.Error("no audit entry for the token by admin:owner (without the secret)")
			}
			list, err := e.admin.ListTokens(t.Context(), &adminv1.ListTokensRequest{})
			if err != nil {
				t.Fatal(err)
			}
			listed := false
			for _, tok := range list.Tokens {
				listed = listed || (tok.Id == resp.Info.Id && tok.CreatedBy == pki.OwnerName && tok.UsedUnix == 0)
			}
			if !listed {
				t.Errorf("ListTokens = %v, want token %s", list.Tokens, resp.Info.Id)
			}
		})
	}
}

func TestListAndGetNodes(t *testing.T) {
	e := newEnv(t)
	web := e.newNode(t, "web")
	e.newNode(t, "db")
	list, err := e.admin.ListNodes(t.Context(), &adminv1.ListNodesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Nodes) != 2 || list.Nodes[0].Id != "db" || list.Nodes[1].Id != "web" {
		t.Fatalf("ListNodes = %v, want db and web", list.Nodes)
	}
	got, err := e.admin.GetNode(t.Context(), &adminv1.GetNodeRequest{Id: "web"})
	if err != nil {
		t.Fatal(err)
	}
	g := got.Node
	if g.CertSerial != web.serial() || g.State != store.StateActive || g.IdentityGeneration != 1 || g.Hostname != "web" ||
		g.SpiffeId != pki.NodeSPIFFEID(trustDomain, "web") || g.JoinedUnix != e.clock.Now().Unix() || g.Attestor != "token" {
		t.Errorf("GetNode(web) = %v", g)
	}
	_, err = e.admin.GetNode(t.Context(), &adminv1.GetNodeRequest{Id: "mail"})
	wantStatus(t, err, codes.NotFound, "get node mail: not found")
}

func TestRevokeAndDeleteRefusals(t *testing.T) {
	cases := []struct {
		name string
		call func(ctx context.Context, c adminv1.AdminClient) error
		code codes.Code
		msg  string
	}{
		{name: "a revocation without a reason", code: codes.InvalidArgument, msg: "a revocation needs a reason (--reason)",
			call: func(ctx context.Context, c adminv1.AdminClient) error {
				_, err := c.RevokeNode(ctx, &adminv1.RevokeNodeRequest{Id: "web", Reason: " \t"})
				return err
			}},
		{name: "a reason of two lines", code: codes.InvalidArgument, msg: "the reason must be one line of at most 256 bytes",
			call: func(ctx context.Context, c adminv1.AdminClient) error {
				_, err := c.RevokeNode(ctx, &adminv1.RevokeNodeRequest{Id: "web", Reason: "lost\nforged: yes"})
				return err
			}},
		{name: "a reason longer than 256 bytes", code: codes.InvalidArgument, msg: "the reason must be one line of at most 256 bytes",
			call: func(ctx context.Context, c adminv1.AdminClient) error {
				_, err := c.DeleteNode(ctx, &adminv1.DeleteNodeRequest{Id: "web", Reason: strings.Repeat("x", 257)})
				return err
			}},
		{name: "a revocation of a node that does not exist", code: codes.NotFound, msg: "revoke node mail: not found",
			call: func(ctx context.Context, c adminv1.AdminClient) error {
				_, err := c.RevokeNode(ctx, &adminv1.RevokeNodeRequest{Id: "mail", Reason: "lost"})
				return err
			}},
		{name: "a deletion of a node that does not exist", code: codes.NotFound, msg: "delete node mail: not found",
			call: func(ctx context.Context, c adminv1.AdminClient) error {
				_, err := c.DeleteNode(ctx, &adminv1.DeleteNodeRequest{Id: "mail"})
				return err
			}},
		{name: "an approval with nothing pending", code: codes.NotFound, msg: "no join of node web is waiting for approval (see fleetd nodes pending)",
			call: func(ctx context.Context, c adminv1.AdminClient) error {
				_, err := c.ApproveNode(ctx, &adminv1.ApproveNodeRequest{Id: "web"})
				return err
			}},
	}
	e := newEnv(t)
	n := e.newNode(t, "web")
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantStatus(t, tc.call(t.Context(), e.admin), tc.code, tc.msg)
		})
	}
	if got := e.storedNode(t, n.id); got.State != store.StateActive || got.Generation != 1 {
		t.Errorf("node %+v after refused calls, want it untouched", got)
	}
	if a := e.audit(t, "node.revoke"); len(a) != 0 {
		t.Errorf("revocation audit %+v, want none", a)
	}
}

func TestDeletedNodeComesBackAboveItsOldGeneration(t *testing.T) {
	e := newEnv(t)
	secret, _ := e.token(t, &adminv1.CreateTokenRequest{Role: "worker", NodeId: "web"})
	m := newMachine(t, "web")
	old := e.mustJoin(t, m, e.request(t, m, secret))
	resp, err := e.admin.DeleteNode(t.Context(), &adminv1.DeleteNodeRequest{Id: "web", Reason: "decommissioned"})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.RevokedSerials) != 1 || resp.RevokedSerials[0] != old.serial() || resp.SessionNotified {
		t.Errorf("DeleteNode = %v, want the one serial and no session", resp)
	}
	if c := e.storedCert(t, old.serial()); c.RevokedReason != "decommissioned" {
		t.Errorf("old certificate %+v, want it revoked as decommissioned", c)
	}
	if a := e.audit(t, "node.delete"); len(a) != 1 || a[0].Subject != "web" || a[0].Actor != "admin:owner" {
		t.Errorf("deletion audit %+v", a)
	}
	// The same machine joins again as web, with a new token: its
	// generation starts above the deleted node's, whose revocation
	// raised it to 2.
	secret2, _ := e.token(t, &adminv1.CreateTokenRequest{Role: "worker", NodeId: "web"})
	m2 := newMachine(t, "web")
	m2.claims = m.claims
	again := e.mustJoin(t, m2, e.request(t, m2, secret2))
	if again.id != "web" || again.gen != 3 {
		t.Fatalf("rejoin made %s generation %d, want web generation 3", again.id, again.gen)
	}
}

// TestAdminStoreFailures fails the store call behind each admin call: the
// admin is told UNAVAILABLE, and the failure is logged with the operation.
func TestAdminStoreFailures(t *testing.T) {
	cases := []struct {
		admin, method, op string
	}{
		{"CreateToken", "CreateToken", "create token"},
		{"ListTokens", "ListTokens", "list tokens"},
		{"ListNodes", "ListNodes", "list nodes"},
		{"GetNode", "GetNode", "get node web"},
		{"RevokeNode", "RevokeNode", "revoke node web"},
		{"DeleteNode", "DeleteNode", "delete node web"},
		{"ApproveNode", "ApprovePending", "approve node web"},
		{"ListPending", "ListPending", "list pending joins"},
		{"ListAudit", "ListAudit", "list audit"},
		{"ListCerts", "ListCerts", "certificates of node web"},
	}
	e := newEnv(t)
	n := e.newNode(t, "web")
	for _, tc := range cases {
		t.Run("a store failure in "+tc.admin+" is UNAVAILABLE", func(t *testing.T) {
			var call func(context.Context, adminv1.AdminClient) error
			for _, c := range adminCalls {
				if c.method == tc.admin {
					call = c.call
				}
			}
			e.store.FailNext(tc.method, storefault.ErrInjected)
			wantStatus(t, call(t.Context(), e.admin), codes.Unavailable, tc.op+": the store failed; retry, and see the server log")
			e.wantFired(t)
			if len(e.logs.find("store failed", "op", tc.op)) == 0 {
				t.Errorf("no log of the failed %s", tc.op)
			}
		})
	}
	t.Run("a conflict in the store is ALREADY_EXISTS", func(t *testing.T) {
		e.store.FailNext("CreateToken", store.ErrConflict)
		_, err := e.admin.CreateToken(t.Context(), &adminv1.CreateTokenRequest{Role: "worker"})
		wantStatus(t, err, codes.AlreadyExists, "create token: conflict")
	})
	if got := e.storedNode(t, n.id); got.State != store.StateActive || got.Generation != 1 {
		t.Errorf("node %+v after failed calls, want it untouched", got)
	}
}

func TestNewNeedsAnAuthorityAndAStore(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		name string
		cfg  service.Config
	}{
		{name: "a config without an authority", cfg: service.Config{Store: e.store}},
		{name: "a config without a store", cfg: service.Config{Authority: e.auth}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := service.New(tc.cfg); err == nil || !strings.Contains(err.Error(), "Authority and Store are required") {
				t.Fatalf("New = %v, want it to name what is missing", err)
			}
		})
	}
}

// ListAudit returns the trail newest first, bounded by its limit, and only
// one subject's events when asked for them.
func TestListAudit(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(t, "web")
	e.newNode(t, "db")
	if _, err := e.admin.RevokeNode(t.Context(), &adminv1.RevokeNodeRequest{Id: n.id, Reason: "disk swapped"}); err != nil {
		t.Fatal(err)
	}
	all, err := e.admin.ListAudit(t.Context(), &adminv1.ListAuditRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Events) < 3 {
		t.Fatalf("%d audit events, want the two joins and the revocation at least", len(all.Events))
	}
	for i := 1; i < len(all.Events); i++ {
		if all.Events[i].TimeUnix > all.Events[i-1].TimeUnix {
			t.Errorf("event %d is newer than event %d: not newest first", i, i-1)
		}
	}
	two, err := e.admin.ListAudit(t.Context(), &adminv1.ListAuditRequest{Limit: 2})
	if err != nil || len(two.Events) != 2 {
		t.Fatalf("ListAudit limit 2 = %d events, %v; want 2", len(two.Events), err)
	}
	web, err := e.admin.ListAudit(t.Context(), &adminv1.ListAuditRequest{Subject: n.id})
	if err != nil {
		t.Fatal(err)
	}
	revoked := false
	for _, ev := range web.Events {
		if ev.Subject != n.id {
			t.Errorf("event %+v is not about %s", ev, n.id)
		}
		revoked = revoked || strings.Contains(ev.Detail, "disk swapped")
	}
	if !revoked {
		t.Errorf("the events of %s do not show the revocation: %v", n.id, web.Events)
	}
}
