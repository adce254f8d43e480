package load

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/nodetrust/nodetrust/api/joinv1"
	"github.com/nodetrust/nodetrust/internal/cputime"
	"github.com/nodetrust/nodetrust/pki"
	"github.com/nodetrust/nodetrust/pki/joinresponse"
	"github.com/nodetrust/nodetrust/pki/tlspin"
)

// FloorItem is one measured operation of the crypto floor: the CPU time
// it takes on one core of this machine.
type FloorItem struct {
	Name        string  `json:"name"`
	Side        string  `json:"side"` // "server" or "client"
	MicrosPerOp float64 `json:"us_per_op"`
}

// FloorOp is the floor of one kind of operation: the sum of its items'
// CPU times on each side.
type FloorOp struct {
	ServerMicros float64  `json:"server_us"`
	ClientMicros float64  `json:"client_us"`
	ServerParts  []string `json:"server_parts"`
	ClientParts  []string `json:"client_parts"`
	// ServerPerCore is 1e6 / ServerMicros: operations per second one core
	// of the server could make if it did nothing but this cryptography.
	ServerPerCore float64 `json:"server_ops_per_core_second"`
	// Machine is what this machine's cores could make with the load tool
	// on the same machine: CPUs × 1e6 / (ServerMicros + ClientMicros).
	Machine float64 `json:"machine_ops_per_second"`
}

// Floor is the crypto floor measured in the run.
type Floor struct {
	Items   []FloorItem `json:"items"`
	Join    FloorOp     `json:"join"`
	Renew   FloorOp     `json:"renew"`
	Session FloorOp     `json:"session"`
}

// Names of the floor's items.
const (
	fTLSServer   = "TLS 1.3 handshake, server end (serving certificate)"
	fTLSClient   = "TLS 1.3 handshake, client end (pin check included)"
	fMTLSServer  = "mutual TLS 1.3 handshake, server end (node certificate checked)"
	fMTLSClient  = "mutual TLS 1.3 handshake, client end"
	fOpenToken   = "HPKE open of the sealed token (OpenToken)"
	fParseCSR    = "CSR parse + signature check (ParseCSR)"
	fIssue       = "sign a leaf (Issuer.IssueLeaf)"
	fSignResult  = "sign the JoinResponse (SignJoinResult)"
	fVerifyProof = "verify a renewal proof (VerifyRenewProof; not on a session)"
	fKeyGen      = "P-256 key generation"
	fCreateCSR   = "CSR creation (CreateCSR)"
	fSeal        = "HPKE seal of the token (SealToken)"
	fSignProof   = "sign the renewal proof (SignRenewProof)"
	fOpenResult  = "check the answer (OpenJoinResponse)"
)

// measureFloor measures, in this process, the cryptography one join and
// one renewal cannot avoid, with a PKI like the server's (pki.Init with
// the server's KEM), spending about d on each item.
func measureFloor(ctx context.Context, kem string, kex []tls.CurveID, d time.Duration) (*Floor, error) {
	dir, err := os.MkdirTemp("", "nodetrust-load-floor-")
	if err != nil {
		return nil, fmt.Errorf("crypto floor: %w", err)
	}
	defer os.RemoveAll(dir)
	if _, err := pki.Init(dir, pki.InitOptions{TrustDomain: startedTrustDomain, ServerName: startedServerName, KEM: kem}); err != nil {
		return nil, fmt.Errorf("crypto floor: %w", err)
	}
	a, err := pki.LoadAuthority(dir)
	if err != nil {
		return nil, fmt.Errorf("crypto floor: %w", err)
	}

	// One node's join, made once; each item repeats one step of it.
	key, err := pki.GenerateKey()
	if err != nil {
		return nil, err
	}
	csr, err := pki.CreateCSR(key)
	if err != nil {
		return nil, err
	}
	h := sha256.Sum256(csr)
	token := []byte("ntjt_0123456789abcdefghijklmnopqrstuvwxyzABCDEFG")
	sealed, err := pki.SealToken(a.JoinEncryption.Public(), h[:], token)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	leafReq := pki.LeafRequest{PublicKey: key.Public(), NodeID: "load-floor-000000", Role: "load",
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour)}
	leaf, err := a.Issuer.Issue(leafReq)
	if err != nil {
		return nil, err
	}
	result := &joinv1.JoinResult{CsrSha256: h[:], Chain: [][]byte{leaf.Raw, a.NodeCA.Raw}, Roots: [][]byte{a.Root.Raw},
		NodeId: leafReq.NodeID, SpiffeId: pki.NodeSPIFFEID(a.TrustDomain, leafReq.NodeID), TrustDomain: a.TrustDomain,
		Role: "load", IdentityGeneration: 1, ServerTimeUnixNano: now.UnixNano()}
	signed, err := joinresponse.Sign(a.JoinSigner, result)
	if err != nil {
		return nil, err
	}
	expect := joinresponse.Expect{SigningKeyPin: a.Bundle.JoinSigningKeyPin, CSRSHA256: h[:], PublicKey: key.Public(),
		TrustDomain: a.TrustDomain, Role: "load", Now: now}
	t := now.UnixNano()
	proof, err := pki.SignRenewProof(key, h[:], t)
	if err != nil {
		return nil, err
	}
	nodeCert := &tls.Certificate{Certificate: [][]byte{leaf.Raw, a.NodeCA.Raw}, PrivateKey: key, Leaf: leaf}

	f := &Floor{}
	add := func(name, side string, fn func() error) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		us, err := cpuPerOp(fn, d)
		if err != nil {
			return fmt.Errorf("crypto floor, %s: %w", name, err)
		}
		f.Items = append(f.Items, FloorItem{Name: name, Side: side, MicrosPerOp: us})
		return nil
	}
	steps := []struct {
		name, side string
		fn         func() error
	}{
		{fOpenToken, "server", func() error { _, err := a.JoinEncryption.OpenToken(h[:], sealed); return err }},
		{fParseCSR, "server", func() error { _, err := pki.ParseCSR(csr); return err }},
		{fIssue, "server", func() error { _, err := a.Issuer.IssueLeaf(leafReq); return err }},
		{fSignResult, "server", func() error { _, err := joinresponse.Sign(a.JoinSigner, result); return err }},
		{fVerifyProof, "server", func() error { return pki.VerifyRenewProof(key.Public(), h[:], t, proof) }},
		{fKeyGen, "client", func() error { _, err := pki.GenerateKey(); return err }},
		{fCreateCSR, "client", func() error { _, err := pki.CreateCSR(key); return err }},
		{fSeal, "client", func() error { _, err := pki.SealToken(a.JoinEncryption.Public(), h[:], token); return err }},
		{fSignProof, "client", func() error { _, err := pki.SignRenewProof(key, h[:], t); return err }},
		{fOpenResult, "client", func() error { _, err := joinresponse.Open(signed, expect); return err }},
	}
	for _, s := range steps {
		if err := add(s.name, s.side, s.fn); err != nil {
			return nil, err
		}
	}
	for _, hs := range []struct {
		server, client string
		cert           *tls.Certificate
	}{{fTLSServer, fTLSClient, nil}, {fMTLSServer, fMTLSClient, nodeCert}} {
		srv, cli, err := handshakeCPU(ctx, a, hs.cert, kex, d)
		if err != nil {
			return nil, fmt.Errorf("crypto floor, TLS handshake: %w", err)
		}
		f.Items = append(f.Items, FloorItem{Name: hs.server, Side: "server", MicrosPerOp: srv},
			FloorItem{Name: hs.client, Side: "client", MicrosPerOp: cli})
	}
	f.Join = f.op([]string{fTLSServer, fOpenToken, fParseCSR, fIssue, fSignResult},
		[]string{fTLSClient, fKeyGen, fCreateCSR, fSeal, fOpenResult})
	// A renewal on the session that its certificate authenticated needs
	// no proof verification (the handshake proved the key; issue 20,
	// docs/performance.md); the item stays measured for the others.
	f.Renew = f.op([]string{fParseCSR, fIssue, fSignResult},
		[]string{fKeyGen, fCreateCSR, fSignProof, fOpenResult})
	f.Session = f.op([]string{fMTLSServer}, []string{fMTLSClient})
	return f, nil
}

func (f *Floor) micros(name string) float64 {
	for _, it := range f.Items {
		if it.Name == name {
			return it.MicrosPerOp
		}
	}
	return 0
}

func (f *Floor) op(server, client []string) FloorOp {
	o := FloorOp{ServerParts: server, ClientParts: client}
	for _, n := range server {
		o.ServerMicros += f.micros(n)
	}
	for _, n := range client {
		o.ClientMicros += f.micros(n)
	}
	if o.ServerMicros > 0 {
		o.ServerPerCore = 1e6 / o.ServerMicros
	}
	if sum := o.ServerMicros + o.ClientMicros; sum > 0 {
		o.Machine = float64(runtime.NumCPU()) * 1e6 / sum
	}
	return o
}

// floorBatches is how many batches an item is measured in; the median
// batch counts.
const floorBatches = 5

// cpuPerOp returns the median over batches of this process's CPU time per
// call of fn, in microseconds. Process CPU time includes the garbage
// collector's share; nothing else runs in the tool while it measures.
func cpuPerOp(fn func() error, d time.Duration) (float64, error) {
	start := time.Now()
	if err := fn(); err != nil {
		return 0, err
	}
	one := max(time.Since(start), time.Microsecond)
	n := max(3, int(d/floorBatches/one))
	per := make([]float64, 0, floorBatches)
	for range floorBatches {
		c0 := cputime.Process()
		for range n {
			if err := fn(); err != nil {
				return 0, err
			}
		}
		per = append(per, float64(cputime.Process()-c0)/float64(time.Microsecond)/float64(n))
	}
	slices.Sort(per)
	return per[len(per)/2], nil
}

// handshakeCPU measures full TLS 1.3 handshakes over loopback TCP between
// a server configured as fleetd's (service.Server.TLSConfig: the serving
// certificate, client certificates verified when given) and a client
// configured as a node's (tlspin.Client, h2), with clientCert as the
// client certificate when not nil. Each end runs on its own locked OS
// thread, whose CPU clock splits the pair's process CPU time between the
// two ends. It returns the median microseconds per handshake of each end.
func handshakeCPU(ctx context.Context, a *pki.Authority, clientCert *tls.Certificate, kex []tls.CurveID, d time.Duration) (server, client float64, err error) {
	pool := x509.NewCertPool()
	pool.AddCert(a.ServingCA)
	pool.AddCert(a.NodeCA)
	scfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{a.ServingCert},
		ClientAuth: tls.VerifyClientCertIfGiven, ClientCAs: pool, NextProtos: []string{"h2"},
		CurvePreferences: kex}
	var get func(*tls.CertificateRequestInfo) (*tls.Certificate, error)
	if clientCert != nil {
		get = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return clientCert, nil }
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, 0, err
	}
	defer ln.Close()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	one := func() (srv, cli, pair time.Duration, err error) {
		cc, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return 0, 0, 0, err
		}
		defer cc.Close()
		sc, err := ln.Accept()
		if err != nil {
			return 0, 0, 0, err
		}
		defer sc.Close()
		ccfg := tlspin.Client(a.Bundle.ServingCASPKIPin, a.Bundle.ServerName, get)
		ccfg.NextProtos = []string{"h2"}
		type end struct {
			cpu time.Duration
			err error
		}
		done := make(chan end, 1)
		p0 := cputime.Process()
		go func() {
			runtime.LockOSThread()
			// Unlock before the goroutine ends, or the runtime ends its
			// thread, and a child started from that thread with
			// Pdeathsig (fleetd) would be killed.
			defer runtime.UnlockOSThread()
			t0 := threadCPU()
			err := tls.Server(sc, scfg).HandshakeContext(ctx)
			done <- end{threadCPU() - t0, err}
		}()
		t0 := threadCPU()
		cerr := tls.Client(cc, ccfg).HandshakeContext(ctx)
		cli = threadCPU() - t0
		s := <-done
		pair = cputime.Process() - p0
		if err := errors.Join(cerr, s.err); err != nil {
			return 0, 0, 0, err
		}
		return s.cpu, cli, pair, nil
	}

	start := time.Now()
	if _, _, _, err := one(); err != nil {
		return 0, 0, err
	}
	n := max(3, int(d/floorBatches/max(time.Since(start), time.Microsecond)))
	var srvPer, cliPer []float64
	for range floorBatches {
		var s, c, p time.Duration
		for range n {
			si, ci, pi, err := one()
			if err != nil {
				return 0, 0, err
			}
			s, c, p = s+si, c+ci, p+pi
		}
		// Split the pair's process CPU (garbage collection included) in
		// the ratio of the two threads' CPU.
		if s+c > 0 {
			share := float64(s) / float64(s+c)
			pairUS := float64(p) / float64(time.Microsecond) / float64(n)
			srvPer = append(srvPer, pairUS*share)
			cliPer = append(cliPer, pairUS*(1-share))
		}
	}
	if len(srvPer) == 0 {
		return 0, 0, errors.New("no CPU time measured")
	}
	slices.Sort(srvPer)
	slices.Sort(cliPer)
	return srvPer[len(srvPer)/2], cliPer[len(cliPer)/2], nil
}
