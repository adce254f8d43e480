package integration

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	agentv1 "github.com/spiffe/spire-api-sdk/proto/spire/api/server/agent/v1"
	"github.com/spiffe/spire-api-sdk/proto/spire/api/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"

	"github.com/nodetrust/nodetrust/internal/cputime"
	"github.com/nodetrust/nodetrust/internal/load"
)

// peerNodes is how many machines each side of BenchmarkAgainstSPIRE joins
// and renews per round: 100 for bench-smoke's one round, 2,000 for the
// figures in docs/performance.md ("nodetrust beside SPIRE").
var peerNodes = flag.Int("peer-nodes", 200, "BenchmarkAgainstSPIRE: machines joined and renewed per round on each side")

// peerInFlight is the operations each side keeps in flight, as
// nodetrust-load does by default.
const peerInFlight = 64

// BenchmarkAgainstSPIRE sets nodetrust beside SPIRE v1.13.3 on this
// machine, in one run: each round (one per b.N: -benchtime 6x makes six)
// joins and renews peerNodes machines on a fresh fleetd (nodetrust-load's
// join and renewal phases: a token join on a fresh TLS connection, a
// renewal with a new key over the held session) and on a fresh SPIRE
// server (join_token attestation on a fresh TLS connection, RenewAgent
// with a new key over a held mutual-TLS connection), 64 in flight on each
// side, nodetrust first in odd rounds and SPIRE first in even ones. It
// reports each server's CPU time per operation (its process's, from
// /proc, in 10 ms steps: the clients share the cores, so rates say
// little) and SPIRE's over nodetrust's. A server's own background work
// during a phase counts in it; work it defers past the phase does not.
//
// Each side is as its users run it: fleetd with its defaults
// (synchronous=FULL SQLite, a signed answer), SPIRE with its SQLite
// datastore, its in-memory key manager and INFO logging; both with their
// per-source limits lifted, since every simulated machine is 127.0.0.1.
// The SPIRE client skips the server's certificate check, as an agent's
// insecure_bootstrap does; that costs the server nothing either way.
func BenchmarkAgainstSPIRE(b *testing.B) {
	spireBin(b, "spire-server")
	fleetd := bin(b, "fleetd")
	var nodetrustJoin, nodetrustRenew, spireJoin, spireRenew time.Duration
	var rounds int
	for b.Loop() {
		rounds++
		var nj, nr, sj, sr time.Duration
		nodetrust := func() { nj, nr = nodetrustRound(b, fleetd, *peerNodes) }
		spire := func() {
			s := startSPIREWith(b, "bench.test", spireOptions{logLevel: "INFO"})
			sj, sr = spireRound(b, s, *peerNodes)
			s.stop()
		}
		if rounds%2 == 1 {
			nodetrust()
			spire()
		} else {
			spire()
			nodetrust()
		}
		b.Logf("round %d, %d machines: join nodetrust %s SPIRE %s (%.2f×), renewal nodetrust %s SPIRE %s (%.2f×)",
			rounds, *peerNodes, micros(nj), micros(sj), float64(sj)/float64(nj), micros(nr), micros(sr), float64(sr)/float64(nr))
		nodetrustJoin += nj
		nodetrustRenew += nr
		spireJoin += sj
		spireRenew += sr
	}
	n := float64(rounds)
	b.ReportMetric(float64(nodetrustJoin.Microseconds())/n, "nodetrust-join-cpu-us")
	b.ReportMetric(float64(spireJoin.Microseconds())/n, "spire-join-cpu-us")
	b.ReportMetric(float64(spireJoin)/float64(nodetrustJoin), "spire/nodetrust-join")
	b.ReportMetric(float64(nodetrustRenew.Microseconds())/n, "nodetrust-renew-cpu-us")
	b.ReportMetric(float64(spireRenew.Microseconds())/n, "spire-renew-cpu-us")
	b.ReportMetric(float64(spireRenew)/float64(nodetrustRenew), "spire/nodetrust-renew")
}

func micros(d time.Duration) string { return fmt.Sprintf("%d µs", d.Microseconds()) }

// nodetrustRound runs nodetrust-load's join and renewal phases for nodes
// machines on a fleetd of its own and returns the server's CPU per join
// and per renewal.
func nodetrustRound(b *testing.B, fleetd string, nodes int) (join, renew time.Duration) {
	b.Helper()
	var out, log bytes.Buffer
	rep, err := load.Run(b.Context(), load.Config{
		Nodes: nodes, Renewals: 1, Revoke: 0, Fleetd: fleetd,
		FloorTime: 50 * time.Millisecond, Settle: 100 * time.Millisecond,
		Out: &out, Log: &log,
	})
	if err != nil {
		b.Fatalf("nodetrust-load: %v\n%s%s", err, out.String(), log.String())
	}
	if !rep.OK {
		b.Fatalf("nodetrust-load's checks failed:\n%s%s", out.String(), log.String())
	}
	for _, p := range rep.Phases {
		if p.Server == nil || p.Ops == 0 {
			continue
		}
		perOp := time.Duration(p.Server.CPUPerOpMs * float64(time.Millisecond))
		switch p.Name {
		case "join":
			join = perOp
		case "renew":
			renew = perOp
		}
	}
	if join == 0 || renew == 0 {
		b.Fatalf("nodetrust-load reported no server CPU for the join or the renewal:\n%s", out.String())
	}
	return join, renew
}

// spireAgent is one simulated SPIRE agent.
type spireAgent struct {
	token string
	// key and chain are its agent SVID, once attested.
	key   *ecdsa.PrivateKey
	chain [][]byte
	// csr is its attestation's CSR, for key.
	csr []byte
	// next is the key and CSR of its renewal.
	next    *ecdsa.PrivateKey
	nextCSR []byte
	conn    *grpc.ClientConn
}

// spireRound joins nodes agents to s with join tokens, each on a fresh
// TLS connection, then renews each once over a connection opened before
// the phase, and returns the server's CPU per attestation and per
// renewal.
func spireRound(b *testing.B, s *spireServer, nodes int) (join, renew time.Duration) {
	b.Helper()
	ctx := b.Context()
	addr := "127.0.0.1:" + s.port
	agents := make([]*spireAgent, nodes)
	// Tokens, keys and CSRs before the phase, as nodetrust-load prepares
	// its nodes'.
	inFlight(nodes, func(i int) error {
		tok := make([]byte, 16)
		_, _ = rand.Read(tok)
		a := &spireAgent{token: hex.EncodeToString(tok)}
		if _, err := s.agents.CreateJoinToken(ctx, &agentv1.CreateJoinTokenRequest{Ttl: 600, Token: a.token}); err != nil {
			return fmt.Errorf("create join token: %w", err)
		}
		var err error
		if a.key, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return err
		}
		if a.csr, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, a.key); err != nil {
			return err
		}
		if a.next, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
			return err
		}
		if a.nextCSR, err = x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, a.next); err != nil {
			return err
		}
		agents[i] = a
		return nil
	}, b)

	join = serverCPUPerOp(b, s.pid, nodes, func() {
		inFlight(nodes, func(i int) error { return agents[i].attest(ctx, addr) }, b)
	})

	// The renewals' connections, each past its handshake before the
	// phase, as nodetrust's sessions are.
	inFlight(nodes, func(i int) error { return agents[i].connect(ctx, addr) }, b)
	defer func() {
		for _, a := range agents {
			if a.conn != nil {
				a.conn.Close()
			}
		}
	}()
	renew = serverCPUPerOp(b, s.pid, nodes, func() {
		inFlight(nodes, func(i int) error { return agents[i].renew(ctx) }, b)
	})
	return join, renew
}

// attest makes the join_token attestation of a on a connection of its
// own, as a new spire-agent does.
func (a *spireAgent) attest(ctx context.Context, addr string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})))
	if err != nil {
		return err
	}
	defer conn.Close()
	stream, err := agentv1.NewAgentClient(conn).AttestAgent(ctx)
	if err != nil {
		return fmt.Errorf("attest: %w", err)
	}
	err = stream.Send(&agentv1.AttestAgentRequest{Step: &agentv1.AttestAgentRequest_Params_{Params: &agentv1.AttestAgentRequest_Params{
		Data:   &types.AttestationData{Type: "join_token", Payload: []byte(a.token)},
		Params: &agentv1.AgentX509SVIDParams{Csr: a.csr},
	}}})
	if err != nil {
		return fmt.Errorf("attest: %w", err)
	}
	resp, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("attest: %w", err)
	}
	svid := resp.GetResult().GetSvid()
	if svid == nil || len(svid.CertChain) == 0 {
		return errors.New("attest: no SVID in the answer")
	}
	a.chain = svid.CertChain
	return stream.CloseSend()
}

// connect opens a's mutual-TLS connection with its agent SVID and waits
// until it is ready.
func (a *spireAgent) connect(ctx context.Context, addr string) error {
	cert := tls.Certificate{Certificate: a.chain, PrivateKey: a.key}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		InsecureSkipVerify: true,
		Certificates:       []tls.Certificate{cert},
	})))
	if err != nil {
		return err
	}
	a.conn = conn
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if s == connectivity.TransientFailure || !conn.WaitForStateChange(ctx, s) {
			return fmt.Errorf("connect as agent: state %s", s)
		}
	}
	return nil
}

// renew renews a's agent SVID for its next key.
func (a *spireAgent) renew(ctx context.Context) error {
	resp, err := agentv1.NewAgentClient(a.conn).RenewAgent(ctx, &agentv1.RenewAgentRequest{Params: &agentv1.AgentX509SVIDParams{Csr: a.nextCSR}})
	if err != nil {
		return fmt.Errorf("renew: %w", err)
	}
	if len(resp.GetSvid().GetCertChain()) == 0 {
		return errors.New("renew: no SVID in the answer")
	}
	return nil
}

// serverCPUPerOp runs phase and returns process pid's CPU time over it
// per operation, ops operations.
func serverCPUPerOp(b *testing.B, pid, ops int, phase func()) time.Duration {
	b.Helper()
	before, err := cputime.OfProcess(pid)
	if err != nil {
		b.Fatal(err)
	}
	phase()
	after, err := cputime.OfProcess(pid)
	if err != nil {
		b.Fatal(err)
	}
	return (after - before) / time.Duration(ops)
}

// inFlight runs f for 0..n-1, peerInFlight at a time, and fails b with
// the first error and how many failed.
func inFlight(n int, f func(i int) error, b *testing.B) {
	b.Helper()
	var next, failed atomic.Int64
	var first atomic.Pointer[error]
	var wg sync.WaitGroup
	for range min(peerInFlight, n) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < n; i = int(next.Add(1) - 1) {
				if err := f(i); err != nil {
					failed.Add(1)
					first.CompareAndSwap(nil, &err)
				}
			}
		})
	}
	wg.Wait()
	if err := first.Load(); err != nil {
		b.Fatalf("%d of %d failed; the first: %v", failed.Load(), n, *err)
	}
}
