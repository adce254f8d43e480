package agent_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nodetrust/nodetrust/api/adminv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/internal/bcd/hwclaims"
	"github.com/nodetrust/nodetrust/internal/bcd/identity"
	"github.com/nodetrust/nodetrust/pki"
)

// joinConfig is a join of a new machine named hostname with the token
// secret; tokenRead is set when the join reads the token.
func (cp *controlPlane) joinConfig(t *testing.T, dir, secret, hostname string, tokenRead *bool) agent.JoinConfig {
	t.Helper()
	n := hostSeq.Add(1)
	return agent.JoinConfig{
		Servers: []string{cp.addr}, ServerName: "localhost", Pins: cp.pins, DataDir: dir,
		Token: func() ([]byte, error) {
			if tokenRead != nil {
				*tokenRead = true
			}
			return []byte(secret), nil
		},
		Claims:  hwclaims.Claims{ProductUUID: fmt.Sprintf("00000000-0000-4000-8000-%012d", n), Hostname: hostname},
		Version: "test",
		Sleep: func(context.Context, time.Duration) error {
			return errors.New("the join slept; this test wants no wait")
		},
	}
}

func (cp *controlPlane) secret(t *testing.T, req *adminv1.CreateTokenRequest) string {
	t.Helper()
	resp, err := cp.admin.CreateToken(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	return resp.Token
}

// wantNoIdentity checks that dir holds no identity.
func wantNoIdentity(t *testing.T, dir string) {
	t.Helper()
	if _, err := identity.LoadState(dir, identity.LoadOptions{}); !errors.Is(err, identity.ErrNotJoined) {
		t.Errorf("LoadState = %v, want ErrNotJoined", err)
	}
}

func TestJoinWithTheWellKnownDocument(t *testing.T) {
	cp := startControlPlane(t)
	dir := t.TempDir()
	c := cp.joinConfig(t, dir, cp.secret(t, &adminv1.CreateTokenRequest{Role: "worker", Site: "fra1"}), "web-1.example.com", nil)
	c.JWK = nil // taken from the well-known document, checked against the pins
	res, err := agent.Join(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	id := res.State.Identity
	if res.Already || id.NodeID != "web-1" || id.Site != "fra1" || id.Role != "worker" || id.Attestor != "token" || id.KeyKind != identity.KeyKindFile || id.Generation != 1 {
		t.Fatalf("joined identity %+v (already %t)", id, res.Already)
	}
	if got := serialOf(load(t, dir)); got != serialOf(res.State) {
		t.Errorf("identity.json holds %s, Join returned %s", got, serialOf(res.State))
	}
	n, err := cp.db.GetNode(t.Context(), "web-1")
	if err != nil || n.CertSerial != serialOf(res.State) || n.DaemonVersion != "test" {
		t.Errorf("control plane's node %+v, %v", n, err)
	}
}

func TestJoinRefusals(t *testing.T) {
	cases := []struct {
		name string
		// prepare returns the join to run; it may join other machines
		// first.
		prepare func(t *testing.T, cp *controlPlane, dir string, tokenRead *bool) agent.JoinConfig
		want    string
		wantIs  error
		// readsToken: the refusal comes after the token was read.
		readsToken bool
	}{
		{
			name: "a well-known document whose join signing pin is not the pinned one",
			prepare: func(t *testing.T, cp *controlPlane, dir string, tokenRead *bool) agent.JoinConfig {
				c := cp.joinConfig(t, dir, cp.secret(t, &adminv1.CreateTokenRequest{Role: "worker"}), "web", tokenRead)
				c.JWK = nil
				other, _ := pki.GenerateKey()
				c.Pins.JoinSigning, _ = pki.PinOf(other.Public())
				return c
			},
			want: "the well-known document's join_signing_key_pin is",
		},
		{
			name: "a token another machine spent",
			prepare: func(t *testing.T, cp *controlPlane, dir string, tokenRead *bool) agent.JoinConfig {
				secret := cp.secret(t, &adminv1.CreateTokenRequest{Role: "worker"})
				c := cp.joinConfig(t, t.TempDir(), secret, "first", nil)
				c.JWK = cp.jwk
				if _, err := agent.Join(t.Context(), c); err != nil {
					t.Fatal(err)
				}
				c = cp.joinConfig(t, dir, secret, "second", tokenRead)
				c.JWK = cp.jwk
				return c
			},
			wantIs:     agent.ErrJoinRefused,
			readsToken: true,
		},
		{
			name: "a record of the answer that cannot be written",
			prepare: func(t *testing.T, cp *controlPlane, dir string, tokenRead *bool) agent.JoinConfig {
				c := cp.joinConfig(t, dir, cp.secret(t, &adminv1.CreateTokenRequest{Role: "worker"}), "web", tokenRead)
				c.JWK = cp.jwk
				c.Record = func(*joinv1.SignedJoinResult) error { return errors.New("disk full") }
				return c
			},
			want:       "record the join response: disk full",
			readsToken: true,
		},
		{
			name: "a join that asks for another role than the token's",
			prepare: func(t *testing.T, cp *controlPlane, dir string, tokenRead *bool) agent.JoinConfig {
				c := cp.joinConfig(t, dir, cp.secret(t, &adminv1.CreateTokenRequest{Role: "worker"}), "web", tokenRead)
				c.JWK = cp.jwk
				c.Role = "gpu"
				return c
			},
			wantIs:     agent.ErrJoinRefused,
			readsToken: true,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cp := startControlPlane(t)
			dir := t.TempDir()
			read := false
			_, err := agent.Join(t.Context(), tc.prepare(t, cp, dir, &read))
			if err == nil || (tc.wantIs != nil && !errors.Is(err, tc.wantIs)) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Join = %v, want %v %q", err, tc.wantIs, tc.want)
			}
			if read != tc.readsToken {
				t.Errorf("token read = %t, want %t", read, tc.readsToken)
			}
			wantNoIdentity(t, dir)
		})
	}
}

func TestJoinWaitsForApproval(t *testing.T) {
	cp := startControlPlane(t)
	dir := t.TempDir()
	c := cp.joinConfig(t, dir, cp.secret(t, &adminv1.CreateTokenRequest{Role: "worker", RequireApproval: true}), "web", nil)
	c.JWK = cp.jwk
	var messages []string
	var waits []time.Duration
	c.Waiting = func(msg string, next time.Duration) { messages = append(messages, msg) }
	c.Sleep = func(ctx context.Context, d time.Duration) error {
		waits = append(waits, d)
		if len(waits) == 2 {
			// The owner approves while the node waits its second round.
			if _, err := cp.admin.ApproveNode(ctx, &adminv1.ApproveNodeRequest{Id: "web"}); err != nil {
				return err
			}
		}
		return nil
	}
	res, err := agent.Join(t.Context(), c)
	if err != nil {
		t.Fatal(err)
	}
	if res.State.Identity.NodeID != "web" {
		t.Errorf("joined as %s, want web", res.State.Identity.NodeID)
	}
	if len(messages) != 2 || !strings.Contains(messages[0], "fleetd nodes approve web") {
		t.Errorf("Waiting told %q, want two rounds naming the approval command", messages)
	}
	// The server asks for a poll every 2 s (its default).
	if len(waits) != 2 || waits[0] != 2*time.Second || waits[1] != 2*time.Second {
		t.Errorf("waits %v, want two of the server's 2s", waits)
	}
}

func TestJoinOnAJoinedMachine(t *testing.T) {
	cp := startControlPlane(t)
	dir, st := cp.joinNode(t, false)
	cases := []struct {
		name   string
		nodeID string
		wantIs error
	}{
		{name: "a machine whose identity loads answers already joined without reading the token", nodeID: ""},
		{name: "the same node id asked again is already joined too", nodeID: st.Identity.NodeID},
		{name: "another node id is refused", nodeID: "other", wantIs: agent.ErrOtherNode},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			read := false
			c := cp.joinConfig(t, dir, "ntjt_unused", "web", &read)
			c.NodeID = tc.nodeID
			res, err := agent.Join(t.Context(), c)
			if read {
				t.Error("the join read the token")
			}
			if tc.wantIs != nil {
				if !errors.Is(err, tc.wantIs) || !strings.Contains(err.Error(), "bcd join --reset --yes") {
					t.Fatalf("Join = %v, want %v with the way back", err, tc.wantIs)
				}
				return
			}
			if err != nil || !res.Already || res.State.Identity.NodeID != st.Identity.NodeID {
				t.Fatalf("Join = %+v, %v; want already joined as %s", res, err, st.Identity.NodeID)
			}
		})
	}
}
