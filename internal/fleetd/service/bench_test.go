package service

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"runtime"
	rtmetrics "runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"github.com/nodetrust/nodetrust/api/gatewayv1"
	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/api/sessionframe"
	"github.com/nodetrust/nodetrust/internal/benchcpu"
	"github.com/nodetrust/nodetrust/internal/fleetd/store"
	"github.com/nodetrust/nodetrust/internal/fleetd/store/sqlite"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/joinresponse"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// The benchmarks of the server's hot paths run the handlers in process,
// without TLS, on a real PKI (pki.Init) and a real SQLite store in
// b.TempDir(): what a join or a renewal costs the server beyond the
// handshake. The load tool (cmd/nodetrust-load) measures the whole.

const benchTrustDomain = "bench.nodetrust.test"

// benchServer returns a Server on a new PKI and SQLite store.
func benchServer(b *testing.B) *Server {
	b.Helper()
	return testServer(b, Config{RenewalLimit: 1 << 30})
}

// testServer returns a Server with cfg on a new PKI (pki.Init) and SQLite
// store in a temporary folder.
func testServer(tb testing.TB, cfg Config) *Server {
	tb.Helper()
	dir := tb.TempDir()
	if _, err := pki.Init(filepath.Join(dir, "pki"), pki.InitOptions{TrustDomain: benchTrustDomain, ServerName: "fleetd.bench"}); err != nil {
		tb.Fatal(err)
	}
	auth, err := pki.LoadAuthority(filepath.Join(dir, "pki"))
	if err != nil {
		tb.Fatal(err)
	}
	st, err := sqlite.Open(context.Background(), filepath.Join(dir, "fleetd.db"))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	cfg.Authority, cfg.Store = auth, st
	s, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// benchJoin is a prepared token join: a stored token, and a request with
// its own key, CSR and hardware claims and the token sealed to the CSR.
type benchJoin struct {
	key     *ecdsa.PrivateKey
	csrHash []byte
	req     *joinv1.JoinRequest
}

func prepareJoins(b testing.TB, s *Server, n int) []benchJoin {
	b.Helper()
	out := make([]benchJoin, n)
	for i := range out {
		secret, id := storeToken(b, s)
		out[i] = tokenJoin(b, s, secret, fmt.Sprintf("bench-%s-%d", id, i))
	}
	return out
}

// storeToken stores a new worker token and returns its secret and id.
func storeToken(tb testing.TB, s *Server) (secret, id string) {
	tb.Helper()
	secret, hash, id, err := NewToken()
	if err != nil {
		tb.Fatal(err)
	}
	now := s.cfg.Now()
	if err := s.cfg.Store.CreateToken(context.Background(), store.Token{ID: id, Hash: hash, Role: "worker", CreatedBy: "bench",
		CreatedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
		tb.Fatal(err)
	}
	return secret, id
}

// tokenJoin is a join with secret sealed to a new key's CSR, claiming a
// random product UUID and hostname.
func tokenJoin(tb testing.TB, s *Server, secret, hostname string) benchJoin {
	tb.Helper()
	key, err := pki.GenerateKey()
	if err != nil {
		tb.Fatal(err)
	}
	csr, err := pki.CreateCSR(key)
	if err != nil {
		tb.Fatal(err)
	}
	h := sha256.Sum256(csr)
	sealed, err := pki.SealToken(s.cfg.Authority.JoinEncryption.Public(), h[:], []byte(secret))
	if err != nil {
		tb.Fatal(err)
	}
	uuid := make([]byte, 16)
	_, _ = rand.Read(uuid)
	return benchJoin{key: key, csrHash: h[:], req: &joinv1.JoinRequest{
		Csr: csr, Attestor: "token", SealedToken: sealed, DaemonVersion: "bench",
		Claims: &joinv1.HardwareClaims{ProductUuid: hex.EncodeToString(uuid), Hostname: hostname},
	}}
}

// BenchmarkJoin is JoinService.Join on a prepared sealed request, TLS
// excluded: CSR check, HPKE open, token and reclaim look-ups, leaf
// issuance, the join's store transaction, the signed answer and the audit
// entry. Parallel runs GOMAXPROCS joins at once, as a busy server does.
func BenchmarkJoin(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		s := benchServer(b)
		joins := prepareJoins(b, s, b.N)
		j := &joinService{s: s}
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		reportCPU := benchcpu.Start(b)
		for i := 0; i < b.N; i++ {
			resp, err := j.Join(ctx, joins[i].req)
			if err != nil || resp.GetSigned() == nil {
				b.Fatalf("join %d: %v", i, err)
			}
		}
		reportCPU()
	})
	b.Run("parallel", func(b *testing.B) {
		s := benchServer(b)
		joins := prepareJoins(b, s, b.N)
		j := &joinService{s: s}
		ctx := context.Background()
		var next atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		defer benchcpu.Start(b)()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				i := next.Add(1) - 1
				resp, err := j.Join(ctx, joins[i].req)
				if err != nil || resp.GetSigned() == nil {
					b.Errorf("join %d: %v", i, err)
					return
				}
			}
		})
	})
}

// benchNode is a joined node as the renewal benchmark renews it.
type benchNode struct {
	caller *authedNode
	chain  [][]byte
	key    *ecdsa.PrivateKey
}

// joinNodes joins n nodes and returns them authenticated by their first
// certificate, as a session's caller is.
func joinNodes(b testing.TB, s *Server, n int) []*benchNode {
	b.Helper()
	ctx := context.Background()
	j := &joinService{s: s}
	var out []*benchNode
	for _, bj := range prepareJoins(b, s, n) {
		resp, err := j.Join(ctx, bj.req)
		if err != nil {
			b.Fatal(err)
		}
		opened, err := joinresponse.Open(resp.GetSigned(), joinresponse.Expect{SigningKeyPin: s.cfg.Authority.Bundle.JoinSigningKeyPin,
			CSRSHA256: bj.csrHash, PublicKey: bj.key.Public()})
		if err != nil {
			b.Fatal(err)
		}
		caller, err := s.checkNodeCert(ctx, opened.Leaf)
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, &benchNode{caller: caller, chain: opened.Result.Chain, key: bj.key})
	}
	return out
}

// BenchmarkRenewVerify is the server's renewal path as a session runs
// it, TLS and the stream excluded: chain and store checks of the current
// certificate, the proof of possession, the CSR, the renewal limit, leaf
// issuance, the store write and the signed answer. Renewals rotate over
// up to 200 nodes, a few per node, each with a new key and a proof by the
// node's current one, made before the timer starts.
func BenchmarkRenewVerify(b *testing.B) {
	s := benchServer(b)
	nodes := joinNodes(b, s, min(b.N, 200))
	type prepared struct {
		csr   []byte
		t     int64
		proof []byte
	}
	reqs := make([]prepared, b.N)
	for i := range reqs {
		n := nodes[i%len(nodes)]
		key, err := pki.GenerateKey()
		if err != nil {
			b.Fatal(err)
		}
		csr, err := pki.CreateCSR(key)
		if err != nil {
			b.Fatal(err)
		}
		h := sha256.Sum256(csr)
		t := time.Now().UnixNano()
		proof, err := pki.SignRenewProof(n.key, h[:], t)
		if err != nil {
			b.Fatal(err)
		}
		reqs[i] = prepared{csr: csr, t: t, proof: proof}
		n.key = key
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	defer benchcpu.Start(b)()
	for i := 0; i < b.N; i++ {
		n := nodes[i%len(nodes)]
		r := reqs[i]
		signed, rerr := s.renew(ctx, n.caller, &joinv1.RenewRequest{Csr: r.csr, Chain: n.chain, ClientTimeUnixNano: r.t, Proof: r.proof}, nil)
		if rerr != nil {
			b.Fatalf("renewal %d: %v", i, rerr)
		}
		// The next renewal of this node presents the certificate just
		// issued, as a node does.
		var res joinv1.JoinResult
		if err := proto.Unmarshal(signed.Payload, &res); err != nil {
			b.Fatal(err)
		}
		n.chain = res.Chain
	}
}

// BenchmarkRenewChecks isolates the checks a renewal makes of the
// certificate it renews before any signing: parse and chain verification
// of the presented chain, and the store look-ups of checkNodeCert.
func BenchmarkRenewChecks(b *testing.B) {
	s := benchServer(b)
	n := joinNodes(b, s, 1)[0]
	ctx := context.Background()
	roots := x509.NewCertPool()
	roots.AddCert(s.cfg.Authority.Root)
	b.Run("chain", func(b *testing.B) {
		for b.Loop() {
			leaf, err := x509.ParseCertificate(n.chain[0])
			if err != nil {
				b.Fatal(err)
			}
			inter := x509.NewCertPool()
			c, err := x509.ParseCertificate(n.chain[1])
			if err != nil {
				b.Fatal(err)
			}
			inter.AddCert(c)
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("store", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.checkNodeCert(ctx, n.caller.leaf); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// sessionsPerHold is how many sessions one iteration of
// BenchmarkSessionHold opens and holds.
const sessionsPerHold = 64

// BenchmarkSessionHold opens Gateway sessions over real mutual TLS on
// loopback, sessionsPerHold per iteration, and holds them all: Hello,
// Welcome, then nothing. It reports the server's goroutines per held
// session (counted by a profiler label the server's goroutines inherit)
// and the process's Go heap and stacks per session after a collection —
// both ends, since the clients run in this process too: an upper bound of
// the server's share, which nodetrust-load measures alone.
func BenchmarkSessionHold(b *testing.B) {
	b.Run("framed", func(b *testing.B) { benchSessionHold(b, true) })
	b.Run("grpc", func(b *testing.B) { benchSessionHold(b, false) })
}

// benchSessionHold holds sessions over the framed transport (as bcd
// opens them) or the gRPC Session.
func benchSessionHold(b *testing.B, framed bool) {
	s := benchServer(b)
	n := b.N * sessionsPerHold
	nodes := joinNodes(b, s, n)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go pprof.Do(ctx, pprof.Labels("side", "server"), func(ctx context.Context) { served <- s.Serve(ctx, ln) })
	defer func() {
		cancel()
		if err := <-served; err != nil {
			b.Error(err)
		}
	}()
	bundle := s.cfg.Authority.Bundle
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	b.StopTimer()
	runtime.GC()
	baseGoroutines := labelledGoroutines(b, "server")
	baseMem := heapAndStacks()
	b.StartTimer()
	reportCPU := benchcpu.Start(b)
	for i := range n {
		node := nodes[i]
		leaf, err := x509.ParseCertificate(node.chain[0])
		if err != nil {
			b.Fatal(err)
		}
		cert := &tls.Certificate{Certificate: node.chain, PrivateKey: node.key, Leaf: leaf}
		tc := tlspin.Client(bundle.ServingCASPKIPin, bundle.ServerName, func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil })
		var stream interface {
			Send(*gatewayv1.SessionRequest) error
			Recv() (*gatewayv1.SessionResponse, error)
		}
		if framed {
			c, err := sessionframe.Dial(ctx, ln.Addr().String(), tc, 0)
			if err != nil {
				b.Fatal(err)
			}
			closers = append(closers, c)
			stream = c
		} else {
			conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(tc)))
			if err != nil {
				b.Fatal(err)
			}
			closers = append(closers, conn)
			if stream, err = gatewayv1.NewGatewayClient(conn).Session(ctx); err != nil {
				b.Fatal(err)
			}
		}
		if err := stream.Send(&gatewayv1.SessionRequest{Id: 1, Body: &gatewayv1.SessionRequest_Hello{Hello: &gatewayv1.Hello{DaemonVersion: "bench", InstanceId: fmt.Sprintf("bench-%d", i)}}}); err != nil {
			b.Fatal(err)
		}
		m, err := stream.Recv()
		if err != nil || m.GetWelcome() == nil {
			b.Fatalf("session %d: %v %v", i, m, err)
		}
	}
	reportCPU()
	b.StopTimer()
	if got := s.sessions.count(); got != n {
		b.Fatalf("%d sessions live, want %d", got, n)
	}
	runtime.GC()
	b.ReportMetric(float64(labelledGoroutines(b, "server")-baseGoroutines)/float64(n), "srv-goroutines/session")
	b.ReportMetric(float64(heapAndStacks()-baseMem)/float64(n), "both-ends-B/session")
	b.ReportMetric(float64(n), "sessions")
}

// labelledGoroutines counts the goroutines carrying profiler label
// side=side, from the goroutine profile's text form.
func labelledGoroutines(tb testing.TB, side string) int {
	tb.Helper()
	var buf bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&buf, 1); err != nil {
		tb.Fatal(err)
	}
	want := fmt.Sprintf("# labels: {%q:%q}", "side", side)
	total, group := 0, 0
	for line := range strings.Lines(buf.String()) {
		line = strings.TrimSpace(line)
		if n, _, ok := strings.Cut(line, " @ "); ok {
			group, _ = strconv.Atoi(n)
			continue
		}
		if line == want {
			total += group
		}
	}
	return total
}

// heapAndStacks is the Go heap's objects and the goroutine stacks, in
// bytes (runtime/metrics).
func heapAndStacks() int64 {
	s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"}}
	rtmetrics.Read(s)
	return int64(s[0].Value.Uint64() + s[1].Value.Uint64())
}
