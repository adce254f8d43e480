package storetest

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/pki"
)

// Run runs the conformance suite against the stores open returns. Each
// sub-test calls open once; it must return a new, empty store, and Run
// closes it when the sub-test ends. open reports its own failures with
// t.Fatal.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			c.run(t, s)
		})
	}
}

type testCase struct {
	name string
	run  func(t *testing.T, s store.Store)
}

// cases are the suite, in the order Run runs them.
var cases = slices.Concat(tokenCases, joinCases, pendingCases, nodeCases, certCases, revokeCases, generationCases, challengeCases, intakeCases, auditCases, concurrencyCases, adminCases, inventoryCases, lifecycleCases, claimCases, ekCases, renewalLimitCases, verdictCases, evidenceCases, exportCases, releaseCases, revokedCertCases)

// t0 is the suite's clock origin. The zone is not UTC on purpose: a store
// must give back the same instant whatever zone it was written in.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.FixedZone("CET", 3600))

// at returns t0 plus d.
func at(d time.Duration) time.Time { return t0.Add(d) }

// hashOf is the token hash of the secret named name.
func hashOf(name string) []byte {
	h := sha256.Sum256([]byte("secret-" + name))
	return h[:]
}

// newToken returns an unused token named id, created at created and
// valid for an hour.
func newToken(id string, created time.Time) store.Token {
	return store.Token{
		ID:        id,
		Hash:      hashOf(id),
		Role:      "worker",
		Site:      "site-a",
		CreatedBy: "admin@example.org",
		CreatedAt: created,
		ExpiresAt: created.Add(time.Hour),
	}
}

// newNode returns an active node named id at generation gen whose current
// certificate is serial, issued at issued.
func newNode(id string, gen uint64, serial string, issued time.Time) store.Node {
	return store.Node{
		ID:         id,
		SPIFFEID:   pki.NodeSPIFFEID("example.org", id),
		Role:       "worker",
		Site:       "site-a",
		State:      store.StateActive,
		Generation: gen,
		Attestor:   "token",
		Claims: store.Claims{
			ProductUUID: "uuid-" + id,
			Serials:     []string{"board-" + id, "chassis-" + id},
			MACs:        []string{"02:00:00:00:00:01", "02:00:00:00:00:02"},
			GPUUUIDs:    []string{"GPU-" + id},
			Hostname:    id + ".example.org",
			BootID:      "boot-" + id,
		},
		DaemonVersion: "v0.1.0",
		JoinedAt:      issued,
		LastSeen:      issued,
		CertSerial:    serial,
		CertNotAfter:  issued.Add(24 * time.Hour),
	}
}

// newCert returns the certificate record of serial for node at gen.
func newCert(serial, node string, gen uint64, kind string, issued time.Time) store.Cert {
	return store.Cert{
		Serial:     serial,
		NodeID:     node,
		Generation: gen,
		Kind:       kind,
		IssuedAt:   issued,
		NotAfter:   issued.Add(24 * time.Hour),
	}
}

// newJoin returns a join of a new node id at generation 1 at now, spending
// the token named token (none when token is empty), with certificate
// serial.
func newJoin(token, id, serial string, now time.Time) store.Join {
	j := store.Join{
		Now:  now,
		Node: newNode(id, 1, serial, now),
		Cert: newCert(serial, id, 1, "join", now),
	}
	if token != "" {
		j.TokenHash = hashOf(token)
	}
	return j
}

// mustCreateToken stores tok or fails the test.
func mustCreateToken(t *testing.T, s store.Store, tok store.Token) {
	t.Helper()
	if err := s.CreateToken(t.Context(), tok); err != nil {
		t.Fatalf("CreateToken(%s): %v", tok.ID, err)
	}
}

// mustJoin completes j or fails the test.
func mustJoin(t *testing.T, s store.Store, j store.Join) {
	t.Helper()
	if err := s.CompleteJoin(t.Context(), j); err != nil {
		t.Fatalf("CompleteJoin(node %s, cert %s): %v", j.Node.ID, j.Cert.Serial, err)
	}
}

// mustGetNode reads node id or fails the test.
func mustGetNode(t *testing.T, s store.Store, id string) store.Node {
	t.Helper()
	n, err := s.GetNode(t.Context(), id)
	if err != nil {
		t.Fatalf("GetNode(%s): %v", id, err)
	}
	return n
}

// mustGetCert reads the certificate serial or fails the test.
func mustGetCert(t *testing.T, s store.Store, serial string) store.Cert {
	t.Helper()
	c, err := s.GetCert(t.Context(), serial)
	if err != nil {
		t.Fatalf("GetCert(%s): %v", serial, err)
	}
	return c
}

// mustGetToken reads the token named id (by its hash) or fails the test.
func mustGetToken(t *testing.T, s store.Store, id string) store.Token {
	t.Helper()
	tok, err := s.TokenByHash(t.Context(), hashOf(id))
	if err != nil {
		t.Fatalf("TokenByHash(%s): %v", id, err)
	}
	return tok
}

// wantErr fails the test unless errors.Is(err, want).
func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: error %v, want one wrapping %v", what, err, want)
	}
}

// wantNoNode fails the test unless node id is absent.
func wantNoNode(t *testing.T, s store.Store, id string) {
	t.Helper()
	_, err := s.GetNode(t.Context(), id)
	wantErr(t, fmt.Sprintf("GetNode(%s)", id), err, store.ErrNotFound)
}

// wantUnspent fails the test unless the token named id is unused.
func wantUnspent(t *testing.T, s store.Store, id string) {
	t.Helper()
	if tok := mustGetToken(t, s, id); !tok.UsedAt.IsZero() || tok.UsedBy != "" {
		t.Errorf("token %s: UsedAt %v, UsedBy %q; want it unused", id, tok.UsedAt, tok.UsedBy)
	}
}

// The norm functions make values comparable with reflect.DeepEqual: times
// in UTC without a monotonic reading, empty lists nil.

func normTime(t time.Time) time.Time { return t.UTC() }

func normList(l []string) []string {
	if len(l) == 0 {
		return nil
	}
	return l
}

func normToken(t store.Token) store.Token {
	t.CreatedAt, t.ExpiresAt, t.UsedAt = normTime(t.CreatedAt), normTime(t.ExpiresAt), normTime(t.UsedAt)
	if len(t.Hash) == 0 {
		t.Hash = nil
	}
	return t
}

func normNode(n store.Node) store.Node {
	n.JoinedAt, n.LastSeen, n.CertNotAfter = normTime(n.JoinedAt), normTime(n.LastSeen), normTime(n.CertNotAfter)
	n.Claims.Serials, n.Claims.MACs, n.Claims.GPUUUIDs = normList(n.Claims.Serials), normList(n.Claims.MACs), normList(n.Claims.GPUUUIDs)
	if len(n.LAKName) == 0 {
		n.LAKName = nil
	}
	return n
}

func normCert(c store.Cert) store.Cert {
	c.IssuedAt, c.NotAfter, c.RevokedAt = normTime(c.IssuedAt), normTime(c.NotAfter), normTime(c.RevokedAt)
	return c
}

func normAudit(e store.AuditEvent) store.AuditEvent {
	e.Time = normTime(e.Time)
	return e
}

// wantEqual fails the test unless got and want are equal after norm.
func wantEqual[T any](t *testing.T, what string, norm func(T) T, got, want T) {
	t.Helper()
	if g, w := norm(got), norm(want); !reflect.DeepEqual(g, w) {
		t.Errorf("%s:\n got  %+v\n want %+v", what, g, w)
	}
}

// newAudit returns an audit event of action on subject at when.
func newAudit(action, subject string, when time.Time) *store.AuditEvent {
	return &store.AuditEvent{
		Time:    when,
		Actor:   "admin@example.org",
		Action:  action,
		Subject: subject,
		Detail:  action + " of " + subject,
	}
}

// wantAudit fails the test unless the audit trail holds exactly the events
// want, newest first as ListAudit orders them.
func wantAudit(t *testing.T, what string, s store.Store, want ...*store.AuditEvent) {
	t.Helper()
	es, err := s.ListAudit(t.Context(), 1000)
	if err != nil {
		t.Fatalf("ListAudit: %v", err)
	}
	if len(es) != len(want) {
		t.Errorf("%s: %d audit events %+v, want %d", what, len(es), es, len(want))
		return
	}
	for i := range es {
		wantEqual(t, what, normAudit, es[i], *want[i])
	}
}

// wantIDs fails the test unless the nodes have exactly the ids want, in
// that order.
func wantIDs(t *testing.T, what string, nodes []store.Node, want ...string) {
	t.Helper()
	got := []string{}
	for _, n := range nodes {
		got = append(got, n.ID)
	}
	if want == nil {
		want = []string{}
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s: nodes %q, want %q", what, got, want)
	}
}

// wantSerials fails the test unless got holds the serials want, in any
// order.
func wantSerials(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	g, w := slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))
	if !slices.Equal(g, w) {
		t.Errorf("%s: serials %q, want %q", what, g, w)
	}
}

// cancelled returns a context that is already cancelled.
func cancelled(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	return ctx
}
