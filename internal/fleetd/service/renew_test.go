package service_test

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/fleetd/service"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/storefault"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/pkitest"
)

// renewal is a renewal request of a node's current certificate and the
// key it asks to certify.
type renewal struct {
	req     *joinv1.RenewRequest
	key     crypto.Signer
	csrHash []byte
}

// renewal builds n's renewal as a node does: a new key and CSR, the
// current chain, the server's time and a proof by the current key.
func (e *env) renewal(t *testing.T, n *node) *renewal {
	t.Helper()
	key, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.CreateCSR(key)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256(csr)
	now := e.clock.Now().UnixNano()
	proof, err := pki.SignRenewProof(n.key, h[:], now)
	if err != nil {
		t.Fatal(err)
	}
	return &renewal{req: &joinv1.RenewRequest{Csr: csr, Chain: n.chain, ClientTimeUnixNano: now, Proof: proof}, key: key, csrHash: h[:]}
}

// renewed checks a signed renewal answer and returns n as it is after it.
func (e *env) renewed(t *testing.T, n *node, r *renewal, signed *joinv1.SignedJoinResult) *node {
	t.Helper()
	o := e.open(t, signed, r.csrHash, r.key.Public())
	if o.Result.NodeId != n.id {
		t.Fatalf("renewal names node %s, want %s", o.Result.NodeId, n.id)
	}
	return &node{id: n.id, gen: o.Result.IdentityGeneration, key: r.key, chain: o.Result.Chain, leaf: o}
}

// renewOnSession renews n over the session stream as request id and
// returns n as it is after it.
func (e *env) renewOnSession(t *testing.T, stream gatewayv1.Gateway_SessionClient, n *node, id uint64) *node {
	t.Helper()
	r := e.renewal(t, n)
	m := call(t, stream, &gatewayv1.SessionRequest{Id: id, Body: &gatewayv1.SessionRequest_Renew{Renew: r.req}})
	if m.GetRenew() == nil {
		t.Fatalf("answer %v to request %d, want a renewal", m, id)
	}
	return e.renewed(t, n, r, m.GetRenew().Signed)
}

func TestRenewIssuesTheNextCertificate(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(t, "web")
	client, _ := e.nodeClients(t, n)
	// Not more: the renewed certificate must be valid in real time too,
	// for the TLS handshake that presents it below.
	e.clock.Advance(30 * time.Second)

	r := e.renewal(t, n)
	resp, err := client.Renew(t.Context(), r.req)
	if err != nil {
		t.Fatalf("Renew: %v", err)
	}
	next := e.renewed(t, n, r, resp.Signed)
	if next.gen != n.gen {
		t.Errorf("renewal moved the generation from %d to %d", n.gen, next.gen)
	}
	if next.serial() == n.serial() {
		t.Fatal("the renewal kept the serial")
	}
	now := e.clock.Now()
	if !next.leaf.Leaf.NotAfter.Equal(now.Add(24 * time.Hour)) {
		t.Errorf("renewed leaf NotAfter %s, want 24h after %s", next.leaf.Leaf.NotAfter, now)
	}
	c := e.storedCert(t, next.serial())
	if c.Kind != "renew" || c.Generation != n.gen || c.NodeID != n.id || !c.IssuedAt.Equal(now) {
		t.Errorf("renewed certificate recorded as %+v", c)
	}
	if got := e.storedNode(t, n.id); got.CertSerial != next.serial() || !got.LastSeen.Equal(now) {
		t.Errorf("node's current serial %s last seen %s, want %s at %s", got.CertSerial, got.LastSeen, next.serial(), now)
	}
	if old := e.storedCert(t, n.serial()); !old.RevokedAt.IsZero() {
		t.Errorf("the renewal revoked the old certificate: %+v", old)
	}
	if len(e.logs.find("node renewed", "serial", next.serial())) != 1 {
		t.Error("the renewal is not logged with its serial")
	}

	// The renewed certificate renews in turn, over a connection that
	// presents it.
	nextClient, _ := e.nodeClients(t, next)
	r2 := e.renewal(t, next)
	resp, err = nextClient.Renew(t.Context(), r2.req)
	if err != nil {
		t.Fatalf("second Renew: %v", err)
	}
	e.renewed(t, next, r2, resp.Signed)
}

// selfSigned is a node-shaped certificate no CA of the server issued.
func selfSigned(t *testing.T, n *node) []byte {
	t.Helper()
	return pkitest.SelfSigned(t, &x509.Certificate{
		Subject:   pkix.Name{CommonName: n.id},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:        n.leaf.Leaf.URIs,
	}, pkitest.NewKey(t)).Raw
}

func TestRenewRefusals(t *testing.T) {
	cases := []struct {
		name  string
		tweak func(*service.Config)
		// edit prepares the renewal r of node n; other is a second node.
		edit func(t *testing.T, e *env, n, other *node, r *renewal)
		code codes.Code
		msg  string
		// after checks the store once the renewal is refused.
		after func(t *testing.T, e *env, n *node)
	}{
		{
			name: "a renewal without the current chain",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) { r.req.Chain = nil },
			code: codes.InvalidArgument, msg: "renewal needs the current chain, leaf first",
		},
		{
			name: "a chain of more than eight certificates",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) {
				r.req.Chain = [][]byte{n.chain[0], n.chain[1], n.chain[1], n.chain[1], n.chain[1], n.chain[1], n.chain[1], n.chain[1], n.chain[1]}
			},
			code: codes.InvalidArgument, msg: "renewal needs the current chain, leaf first",
		},
		{
			name: "a leaf that does not parse",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) { r.req.Chain = [][]byte{[]byte("not DER")} },
			code: codes.InvalidArgument, msg: "parse the current certificate",
		},
		{
			name: "an intermediate that does not parse",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) {
				r.req.Chain = [][]byte{other.chain[0], []byte("not DER")}
			},
			code: codes.InvalidArgument, msg: "parse the chain",
		},
		{
			name: "a certificate no CA of the server issued",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) {
				r.req.Chain = [][]byte{selfSigned(t, n)}
			},
			code: codes.Unauthenticated, msg: "the current certificate does not verify (expired certificates cannot renew: join again)",
		},
		{
			name: "another node's certificate",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) {
				r.req.Chain = other.chain
				r.req.Proof, _ = pki.SignRenewProof(other.key, r.csrHash, r.req.ClientTimeUnixNano)
			},
			code: codes.PermissionDenied, msg: "the certificate renewed is node db's, the caller is node web",
		},
		{
			name: "a certificate that expired by the server's clock",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) {
				e.clock.Advance(25 * time.Hour)
			},
			code: codes.Unauthenticated, msg: "the current certificate is not valid now",
		},
		{
			name: "a client clock six minutes behind",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) {
				r.req.ClientTimeUnixNano = e.clock.Now().Add(-6 * time.Minute).UnixNano()
			},
			code: codes.InvalidArgument, msg: "client time is 6m0s from the control plane's; synchronise the clock",
		},
		{
			name: "a client clock six minutes ahead",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) {
				r.req.ClientTimeUnixNano = e.clock.Now().Add(6 * time.Minute).UnixNano()
			},
			code: codes.InvalidArgument, msg: "client time is -6m0s from the control plane's",
		},
		{
			name: "a CSR larger than 4 KiB",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) { r.req.Csr = make([]byte, 4097) },
			code: codes.InvalidArgument, msg: "CSR larger than 4096 bytes",
		},
		{
			name: "a CSR that does not parse",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) { r.req.Csr = []byte("not DER") },
			code: codes.InvalidArgument, msg: "bad CSR",
		},
		{
			name: "a CSR for the key the certificate already has",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) {
				csr, err := pki.CreateCSR(n.key)
				if err != nil {
					t.Fatal(err)
				}
				h := sha256.Sum256(csr)
				r.req.Csr = csr
				r.req.Proof, _ = pki.SignRenewProof(n.key, h[:], r.req.ClientTimeUnixNano)
			},
			code: codes.InvalidArgument, msg: "the renewal must certify a new key",
		},
		{
			name: "a revocation between the checks and the record",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) {
				e.store.Before("RecordRenewalLimited", 1, func(ctx context.Context) error {
					_, _, err := e.db.RevokeNode(ctx, n.id, "revoked meanwhile", e.clock.Now(), nil)
					return err
				})
			},
			code: codes.Unauthenticated, msg: "node web was revoked during the renewal",
		},
		{
			name: "a certificate revoked before the call",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) {
				if _, err := e.admin.RevokeNode(t.Context(), &adminv1.RevokeNodeRequest{Id: n.id, Reason: "lost"}); err != nil {
					t.Fatal(err)
				}
			},
			code: codes.Unauthenticated, msg: "was revoked (lost)",
		},
		{
			name: "the store fails to record the renewal",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) {
				e.store.FailNext("RecordRenewalLimited", storefault.ErrInjected)
			},
			code: codes.Unavailable, msg: "renewal could not be recorded; retry",
		},
		{
			name: "the store fails to read the caller's certificate",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) {
				e.store.FailNext("GetCert", storefault.ErrInjected)
			},
			code: codes.Unavailable, msg: "get certificate: the store failed; retry",
		},
		{
			name: "the store fails to read the caller's node",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) {
				e.store.FailNext("GetNode", storefault.ErrInjected)
			},
			code: codes.Unavailable, msg: "get node: the store failed; retry",
		},
		{
			name: "the store fails to read the certificate renewed when it is not the connection's",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) {
				// The caller renews other's chain; the connection proved n's.
				r.req.Chain = other.chain
				e.store.FailAt("GetCert", 2, storefault.ErrInjected)
			},
			code: codes.Unavailable, msg: "get certificate: the store failed; retry",
		},
		{
			name: "the store fails to read the node of a certificate that is not the connection's",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) {
				r.req.Chain = other.chain
				e.store.FailAt("GetNode", 2, storefault.ErrInjected)
			},
			code: codes.Unavailable, msg: "get node: the store failed; retry",
		},
		{
			name: "a certificate the store does not know",
			edit: func(t *testing.T, e *env, n, other *node, r *renewal) {
				e.store.FailAt("GetCert", 2, store.ErrNotFound)
				r.req.Chain = other.chain
			},
			code: codes.Unauthenticated, msg: "node certificate refused: unknown certificate",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var tweaks []func(*service.Config)
			if tc.tweak != nil {
				tweaks = append(tweaks, tc.tweak)
			}
			e := newEnv(t, tweaks...)
			n := e.newNode(t, "web")
			other := e.newNode(t, "db")
			client, _ := e.nodeClients(t, n)
			r := e.renewal(t, n)
			tc.edit(t, e, n, other, r)
			_, err := client.Renew(t.Context(), r.req)
			wantStatus(t, err, tc.code, tc.msg)
			e.wantFired(t)
			if times, err := e.db.RenewalTimes(context.Background(), n.id, time.Time{}); err != nil || len(times) != 0 {
				t.Errorf("RenewalTimes = %v, %v; a refused renewal records nothing", times, err)
			}
			if tc.after != nil {
				tc.after(t, e, n)
			}
		})
	}
}

// TestRenewalProofOnlyForACertificateTheConnectionDidNotProve: the
// handshake proved the key of the connection's certificate, and one issued
// on the session was issued to its holder, so neither needs the renewal
// proof (docs/performance.md); any other certificate does, and a proof by
// another key than its own revokes the node as cloned.
func TestRenewalProofOnlyForACertificateTheConnectionDidNotProve(t *testing.T) {
	t.Run("the connection's certificate renews without a proof", func(t *testing.T) {
		e := newEnv(t)
		n := e.newNode(t, "web")
		client, _ := e.nodeClients(t, n)
		r := e.renewal(t, n)
		r.req.Proof = nil
		resp, err := client.Renew(t.Context(), r.req)
		if err != nil {
			t.Fatalf("Renew without a proof: %v", err)
		}
		next := e.renewed(t, n, r, resp.Signed)
		if got := e.storedNode(t, n.id); got.State != store.StateActive || got.CertSerial != next.serial() {
			t.Errorf("node after the renewal: state %s serial %s, want active with %s", got.State, got.CertSerial, next.serial())
		}
	})
	t.Run("a certificate issued on the session renews with a proof by another key", func(t *testing.T) {
		e := newEnv(t)
		n := e.newNode(t, "web")
		_, gw := e.nodeClients(t, n)
		stream, _ := openSession(t, gw, "proc-a")
		n = e.renewOnSession(t, stream, n, 2)
		r := e.renewal(t, n)
		r.req.Proof, _ = pki.SignRenewProof(r.key, r.csrHash, r.req.ClientTimeUnixNano)
		m := call(t, stream, &gatewayv1.SessionRequest{Id: 3, Body: &gatewayv1.SessionRequest_Renew{Renew: r.req}})
		if m.GetRenew() == nil {
			t.Fatalf("answer %v, want a renewal", m)
		}
		next := e.renewed(t, n, r, m.GetRenew().Signed)
		if got := e.storedNode(t, n.id); got.State != store.StateActive || got.CertSerial != next.serial() {
			t.Errorf("node after the renewal: state %s serial %s, want active with %s", got.State, got.CertSerial, next.serial())
		}
	})
	t.Run("another certificate of the node with a proof by another key revokes the node (a cloned certificate)", func(t *testing.T) {
		e := newEnv(t)
		n := e.newNode(t, "web")
		client, _ := e.nodeClients(t, n)
		r := e.renewal(t, n)
		resp, err := client.Renew(t.Context(), r.req)
		if err != nil {
			t.Fatalf("Renew: %v", err)
		}
		// The node's current certificate, on a connection that proved
		// the one before it: each unary call is its own caller.
		next := e.renewed(t, n, r, resp.Signed)
		r = e.renewal(t, next)
		r.req.Proof, _ = pki.SignRenewProof(r.key, r.csrHash, r.req.ClientTimeUnixNano)
		_, err = client.Renew(t.Context(), r.req)
		wantStatus(t, err, codes.Unauthenticated, "renewal proof does not verify with the certified key; the certificate was revoked")
		const reason = "renewal proof by a key other than the certified one"
		if got := e.storedNode(t, n.id); got.State != store.StateRevoked || got.Generation != n.gen+1 {
			t.Errorf("node after a cloned proof: state %s generation %d, want revoked at %d", got.State, got.Generation, n.gen+1)
		}
		if c := e.storedCert(t, next.serial()); c.RevokedAt.IsZero() || c.RevokedReason != reason {
			t.Errorf("certificate after a cloned proof: %+v", c)
		}
		if a := e.audit(t, "node.revoke"); len(a) != 1 || a[0].Actor != "fleetd" || a[0].Subject != n.id || a[0].Detail != reason {
			t.Errorf("revocation audit %+v, want one by fleetd", a)
		}
	})
}

// TestRenewalOfACertificateIssuedOnTheSessionIsChecked: a certificate
// issued on the session is never parsed again (its key and validity are
// read from what was signed), and it still gets the refusals a parsed one
// gets: a CSR for its own key, and a renewal after it expired.
func TestRenewalOfACertificateIssuedOnTheSessionIsChecked(t *testing.T) {
	cases := []struct {
		name string
		// edit prepares the renewal r of next, the certificate issued on
		// the session.
		edit func(t *testing.T, e *env, next *node, r *renewal)
		code codes.Code
		msg  string
	}{
		{
			name: "a CSR for the key the issued certificate already has",
			edit: func(t *testing.T, e *env, next *node, r *renewal) {
				csr, err := pki.CreateCSR(next.key)
				if err != nil {
					t.Fatal(err)
				}
				r.req.Csr = csr
			},
			code: codes.InvalidArgument, msg: "the renewal must certify a new key",
		},
		{
			name: "the issued certificate after it expired",
			edit: func(t *testing.T, e *env, next *node, r *renewal) {
				e.clock.Advance(next.leaf.Leaf.NotAfter.Sub(e.clock.Now()) + time.Second)
				r.req.ClientTimeUnixNano = e.clock.Now().UnixNano()
			},
			code: codes.Unauthenticated, msg: "the current certificate is not valid now (expired certificates cannot renew: join again)",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			n := e.newNode(t, "web")
			_, gw := e.nodeClients(t, n)
			stream, _ := openSession(t, gw, "proc-a")
			next := e.renewOnSession(t, stream, n, 2)
			r := e.renewal(t, next)
			tc.edit(t, e, next, r)
			m := call(t, stream, &gatewayv1.SessionRequest{Id: 3, Body: &gatewayv1.SessionRequest_Renew{Renew: r.req}})
			if got := m.GetError(); got == nil || codes.Code(got.Code) != tc.code || !strings.Contains(got.Message, tc.msg) {
				t.Fatalf("answer %v, want %s containing %q", m, tc.code, tc.msg)
			}
			if got := e.storedNode(t, n.id); got.CertSerial != next.serial() {
				t.Errorf("node's certificate after a refused renewal: %s, want the issued %s", got.CertSerial, next.serial())
			}
		})
	}
}

func TestRenewWithoutANodeCertificate(t *testing.T) {
	e := newEnv(t)
	n := e.newNode(t, "web")
	r := e.renewal(t, n)
	owner := e.dial(t, nil)
	cases := []struct {
		name   string
		client joinv1.JoinServiceClient
	}{
		{name: "a caller without a client certificate", client: e.join},
		{name: "a caller with the admin certificate", client: joinv1.NewJoinServiceClient(owner)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tc.client.Renew(t.Context(), r.req)
			wantStatus(t, err, codes.Unauthenticated, "no node certificate: this call needs the node's certificate (mutual TLS)")
		})
	}
}

// TestRenewalLimit renews up to the limit and checks the pushback the
// next renewal gets, to the millisecond, as the window slides. The store
// refuses the first renewal over the limit; the next ones are refused from
// the server's memory of that refusal, without a store write, alike.
func TestRenewalLimit(t *testing.T) {
	e := newEnv(t, func(c *service.Config) { c.RenewalLimit, c.RenewalWindow = 2, time.Hour })
	n := e.newNode(t, "web")
	client, _ := e.nodeClients(t, n)
	renew := func() (*node, metadata.MD, error) {
		t.Helper()
		r := e.renewal(t, n)
		var trailer metadata.MD
		resp, err := client.Renew(t.Context(), r.req, grpc.Trailer(&trailer))
		if err != nil {
			return nil, trailer, err
		}
		return e.renewed(t, n, r, resp.Signed), trailer, nil
	}
	for i := range 2 {
		next, _, err := renew()
		if err != nil {
			t.Fatalf("renewal %d: %v", i+1, err)
		}
		n = next
		e.clock.Advance(10 * time.Minute)
	}
	// Renewals at 0 and 10 min; now is 20 min.
	steps := []struct {
		name     string
		advance  time.Duration
		pushback string // "" for a renewal that goes through
		msg      string
		records  int // RecordRenewalLimited calls the renewal makes
	}{
		{name: "the third renewal within the hour waits for the first to leave the window", pushback: "2400000", msg: "node web renewed 2 times in 1h0m0s; retry in 40m0s", records: 1},
		{name: "the pushback shrinks as the clock moves", advance: 30 * time.Minute, pushback: "600000", msg: "retry in 10m0s"},
		{name: "at the window's end the first renewal still counts (the store says so: the memory lapses at the retry time)", advance: 10 * time.Minute, pushback: "1", msg: "retry in 1ms", records: 1},
		{name: "a second later the renewal goes through", advance: time.Second, records: 1},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			e.clock.Advance(s.advance)
			before := e.store.Calls("RecordRenewalLimited")
			next, trailer, err := renew()
			if got := e.store.Calls("RecordRenewalLimited") - before; got != s.records {
				t.Errorf("the renewal made %d store records, want %d", got, s.records)
			}
			if s.pushback == "" {
				if err != nil {
					t.Fatalf("Renew: %v", err)
				}
				n = next
				return
			}
			wantStatus(t, err, codes.ResourceExhausted, s.msg)
			if got := trailer.Get("grpc-retry-pushback-ms"); len(got) != 1 || got[0] != s.pushback {
				t.Errorf("grpc-retry-pushback-ms = %v, want %s", got, s.pushback)
			}
		})
	}
	if times, _ := e.db.RenewalTimes(context.Background(), n.id, time.Time{}); len(times) != 3 {
		t.Errorf("%d renewals recorded, want 3", len(times))
	}
}

// TestRenewalLimitCountedWhereTheRenewalIsRecorded records the limit's
// renewals, as another replica would, while the service signs: the
// store's count in the record refuses the renewal with RESOURCE_EXHAUSTED
// and the pushback.
func TestRenewalLimitCountedWhereTheRenewalIsRecorded(t *testing.T) {
	e := newEnv(t, func(c *service.Config) { c.RenewalLimit, c.RenewalWindow = 2, time.Hour })
	n := e.newNode(t, "web")
	client, _ := e.nodeClients(t, n)
	r := e.renewal(t, n)
	e.store.Before("RecordRenewalLimited", 1, func(ctx context.Context) error {
		now := e.clock.Now()
		for i, ago := range []time.Duration{20 * time.Minute, 5 * time.Minute} {
			c := store.Cert{Serial: fmt.Sprintf("elsewhere%d", i), NodeID: n.id, Generation: n.gen, Kind: "renew", IssuedAt: now.Add(-ago), NotAfter: now.Add(time.Hour)}
			if err := e.db.RecordRenewal(ctx, c, nil); err != nil {
				return err
			}
		}
		return nil
	})
	var trailer metadata.MD
	_, err := client.Renew(t.Context(), r.req, grpc.Trailer(&trailer))
	e.wantFired(t)
	wantStatus(t, err, codes.ResourceExhausted, "node web renewed 2 times in 1h0m0s; retry in 40m0s")
	if got := trailer.Get("grpc-retry-pushback-ms"); len(got) != 1 || got[0] != "2400000" {
		t.Errorf("grpc-retry-pushback-ms = %v, want 2400000", got)
	}
	if times, _ := e.db.RenewalTimes(context.Background(), n.id, time.Time{}); len(times) != 2 {
		t.Errorf("%d renewals recorded, want the other replica's 2", len(times))
	}
	if got := e.storedNode(t, n.id); got.CertSerial != "elsewhere1" {
		t.Errorf("node's serial %s, want the last recorded renewal's", got.CertSerial)
	}
}

func TestRenewedLifetimeFollowsTheRole(t *testing.T) {
	e := newEnv(t, func(c *service.Config) { c.NodeCertLifetime = 6 * time.Hour })
	secret, _ := e.token(t, &adminv1.CreateTokenRequest{Role: "ramdisk"})
	m := newMachine(t, "pxe")
	n := e.mustJoin(t, m, e.request(t, m, secret))
	client, _ := e.nodeClients(t, n)
	r := e.renewal(t, n)
	resp, err := client.Renew(t.Context(), r.req)
	if err != nil {
		t.Fatal(err)
	}
	next := e.renewed(t, n, r, resp.Signed)
	if got, want := next.leaf.Leaf.NotAfter.Sub(e.clock.Now()), service.RamdiskMaxLifetime; got != want {
		t.Errorf("renewed ramdisk lifetime %s, want %s", got, want)
	}
	if next.leaf.Info.Role != "ramdisk" {
		t.Errorf("renewed leaf role %q, want ramdisk", next.leaf.Info.Role)
	}
}
