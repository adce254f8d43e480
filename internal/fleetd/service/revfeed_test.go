package service_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/gatewayv1"
)

// subscribe asks for the revocation feed on s and returns the catch-up.
func subscribe(t *testing.T, s gatewayv1.Gateway_SessionClient, id uint64) *gatewayv1.RevokedCerts {
	t.Helper()
	m := call(t, s, &gatewayv1.SessionRequest{Id: id, Body: &gatewayv1.SessionRequest_RevocationFeed{RevocationFeed: &gatewayv1.RevocationFeedRequest{}}})
	rc := m.GetRevokedCerts()
	if rc == nil || !rc.CatchUp || rc.Truncated {
		t.Fatalf("answer to the subscription %v, want a whole catch-up", m)
	}
	return rc
}

func serials(rc *gatewayv1.RevokedCerts) []string {
	var out []string
	for _, c := range rc.Certs {
		out = append(out, c.NodeId+"/"+c.Serial)
	}
	return out
}

func wantSerials(t *testing.T, what string, rc *gatewayv1.RevokedCerts, want ...*node) {
	t.Helper()
	got := serials(rc)
	ok := len(got) == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = got[i] == want[i].id+"/"+want[i].serial()
	}
	if !ok {
		t.Errorf("%s = %v, want the certificates of %d nodes in order of revocation, latest first", what, got, len(want))
	}
	for _, c := range rc.Certs {
		if c.NotAfterUnixNano == 0 {
			t.Errorf("%s: certificate %s has no expiry", what, c.Serial)
		}
	}
}

func revoke(t *testing.T, e *env, n *node) {
	t.Helper()
	if _, err := e.admin.RevokeNode(t.Context(), &adminv1.RevokeNodeRequest{Id: n.id, Reason: "lost"}); err != nil {
		t.Fatal(err)
	}
}

// TestRevocationFeed: a daemon that subscribed learns of another node's
// revocation on its session, and after a reconnect catches up on what it
// missed; one that did not subscribe hears nothing.
func TestRevocationFeed(t *testing.T) { overBothTransports(t, testRevocationFeed) }

func testRevocationFeed(t *testing.T, grpcSessions bool) {
	e := newEnv(t)
	e.grpcSessions = grpcSessions
	a, b, c, d := e.newNode(t, "a"), e.newNode(t, "b"), e.newNode(t, "c"), e.newNode(t, "d")
	_, gwA := e.nodeClients(t, a)
	_, gwC := e.nodeClients(t, c)
	streamA, _ := openSession(t, gwA, "proc-a")
	streamC, _ := openSession(t, gwC, "proc-c")
	if rc := subscribe(t, streamA, 2); len(rc.Certs) != 0 {
		t.Errorf("catch-up before any revocation = %v, want none", serials(rc))
	}

	revoke(t, e, b)
	m, err := streamA.Recv()
	if err != nil {
		t.Fatalf("Recv: %v, want B's revocation", err)
	}
	if m.Id != 0 || m.GetRevokedCerts() == nil || m.GetRevokedCerts().CatchUp {
		t.Fatalf("message %v, want a pushed revocation (id 0, no catch-up)", m)
	}
	wantSerials(t, "pushed revocation", m.GetRevokedCerts(), b)

	// C did not subscribe: what it gets next is the answer to its pings.
	// (Had B's revocation been queued on it, the session's loop would
	// pick it among the ready cases before some of them.)
	for id := uint64(2); id < 6; id++ {
		if r := call(t, streamC, &gatewayv1.SessionRequest{Id: id, Body: &gatewayv1.SessionRequest_Ping{Ping: &gatewayv1.Ping{}}}); r.GetPong() == nil {
			t.Fatalf("unsubscribed session got %v, want a pong", r)
		}
	}

	// C subscribes now: its catch-up holds B.
	wantSerials(t, "catch-up after B's revocation", subscribe(t, streamC, 6), b)
	// Served at /metrics: the two subscribers, their catch-ups and the
	// one certificate pushed (counted as their writes start).
	for _, want := range []string{
		"nodetrust_revocation_feed_subscribers 2",
		`nodetrust_revocation_feed_catchups_total{reason="subscribe"} 2`,
		"nodetrust_revocation_feed_certs_pushed_total 1",
		"nodetrust_revocation_feed_catchups_truncated_total 0",
	} {
		name, _, _ := strings.Cut(want, " ")
		if got := e.metric(t, name+" "); got != want {
			t.Errorf("/metrics has %q, want %q", got, want)
		}
	}

	// Both daemons go away; D is revoked meanwhile, with no subscriber;
	// back, A catches up on it (not from the catch-up C's read left).
	for _, s := range []gatewayv1.Gateway_SessionClient{streamA, streamC} {
		if err := s.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err == nil {
			t.Fatal("the closed session still delivers")
		}
	}
	e.clock.Advance(time.Second) // D's revocation is the later one
	revoke(t, e, d)
	streamA, _ = openSession(t, gwA, "proc-a")
	wantSerials(t, "catch-up after the reconnect", subscribe(t, streamA, 2), d, b)

}
