package agent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/bcd/config"
	"github.com/nodetrust/nodetrust/pki"
)

// flakyJoin is a JoinService that fails the first failures calls with
// code (and a pushback trailer when pushbackMS is set), then refuses with
// PERMISSION_DENIED so the test can tell a finished retry loop apart.
type flakyJoin struct {
	joinv1.UnimplementedJoinServiceServer
	failures   int32
	code       codes.Code
	pushbackMS string
	calls      atomic.Int32
}

func (f *flakyJoin) Join(ctx context.Context, _ *joinv1.JoinRequest) (*joinv1.JoinResponse, error) {
	n := f.calls.Add(1)
	if n <= f.failures {
		if f.pushbackMS != "" {
			_ = grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", f.pushbackMS))
		}
		return nil, status.Error(f.code, "busy")
	}
	return nil, status.Error(codes.PermissionDenied, "Join refused")
}

// startJoinServer serves svc over TLS with a fresh PKI and returns the
// address and the pins a node would be given.
func startJoinServer(t *testing.T, svc joinv1.JoinServiceServer) (string, config.Pins, []byte) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pki")
	b, err := pki.Init(dir, pki.InitOptions{TrustDomain: "agent.test", ServerName: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	auth, err := pki.LoadAuthority(dir)
	if err != nil {
		t.Fatal(err)
	}
	jwk, err := auth.JoinEncryption.Public().MarshalJWK()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(credentials.NewServerTLSFromCert(&auth.ServingCert)))
	joinv1.RegisterJoinServiceServer(g, svc)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	return ln.Addr().String(), config.Pins{ServingCA: b.ServingCASPKIPin, JoinSigning: b.JoinSigningKeyPin, JoinEncryption: b.JoinEncryptionKeyPin}, jwk
}

func TestJoinRetries(t *testing.T) {
	cases := []struct {
		name      string
		svc       *flakyJoin
		wantCalls int32
		wantWaits func(t *testing.T, waits []time.Duration)
	}{
		{
			name:      "a busy server's pushback is waited out exactly",
			svc:       &flakyJoin{failures: 2, code: codes.ResourceExhausted, pushbackMS: "1234"},
			wantCalls: 3,
			wantWaits: func(t *testing.T, waits []time.Duration) {
				if len(waits) != 2 || waits[0] != 1234*time.Millisecond || waits[1] != 1234*time.Millisecond {
					t.Errorf("waits = %v, want two of 1.234s", waits)
				}
			},
		},
		{
			name:      "an unreachable server is retried with growing backoff, 20 attempts in all",
			svc:       &flakyJoin{failures: 1000, code: codes.Unavailable},
			wantCalls: 20,
			wantWaits: func(t *testing.T, waits []time.Duration) {
				if len(waits) != 19 {
					t.Fatalf("%d waits, want 19", len(waits))
				}
				for i, w := range waits {
					lo := min(time.Second<<i, 30*time.Second) / 2
					if w < lo || w > 30*time.Second {
						t.Errorf("wait %d = %s, want within [%s, 30s]", i, w, lo)
					}
				}
			},
		},
		{
			name:      "a refusal is not retried",
			svc:       &flakyJoin{code: codes.PermissionDenied},
			wantCalls: 1,
			wantWaits: func(t *testing.T, waits []time.Duration) {
				if len(waits) != 0 {
					t.Errorf("waits = %v, want none", waits)
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			addr, pins, jwk := startJoinServer(t, tc.svc)
			var waits []time.Duration
			_, err := Join(context.Background(), JoinConfig{
				Servers: []string{addr}, ServerName: "localhost", Pins: pins, JWK: jwk,
				DataDir:    t.TempDir(),
				Token:      func() ([]byte, error) { return []byte("ntjt_test"), nil },
				Logger:     slog.New(slog.DiscardHandler),
				BackoffMin: time.Second, BackoffMax: 30 * time.Second,
				Sleep: func(_ context.Context, d time.Duration) error { waits = append(waits, d); return nil },
			})
			if err == nil {
				t.Fatal("join succeeded against a server that never answers yes")
			}
			if got := tc.svc.calls.Load(); got != tc.wantCalls {
				t.Errorf("%d calls, want %d (err %v)", got, tc.wantCalls, err)
			}
			if tc.wantCalls < 20 && !errors.Is(err, ErrJoinRefused) {
				t.Errorf("err = %v, want ErrJoinRefused", err)
			}
			if tc.wantCalls == 20 && !strings.Contains(err.Error(), "attempt 20 of 20") {
				t.Errorf("err = %v, want it to name the last attempt", err)
			}
			tc.wantWaits(t, waits)
		})
	}
}

func TestJoinRefusesAForeignJoinKey(t *testing.T) {
	addr, pins, _ := startJoinServer(t, &flakyJoin{})
	other, err := pki.GenerateJoinEncryptionKey("")
	if err != nil {
		t.Fatal(err)
	}
	jwk, _ := other.Public().MarshalJWK()
	read := false
	_, err = Join(context.Background(), JoinConfig{
		Servers: []string{addr}, ServerName: "localhost", Pins: pins, JWK: jwk, DataDir: t.TempDir(),
		Token: func() ([]byte, error) { read = true; return []byte("x"), nil },
	})
	if err == nil || !strings.Contains(err.Error(), "join_encryption_key_pin") {
		t.Fatalf("err = %v, want a pin mismatch naming join_encryption_key_pin", err)
	}
	if read {
		t.Error("the token was read although the join key did not match its pin")
	}
}
