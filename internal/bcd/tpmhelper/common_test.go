package tpmhelper

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-tpm/tpm2"

	"github.com/nodetrust/nodetrust/attest"
	"github.com/nodetrust/nodetrust/internal/bcd/agent"
	"github.com/nodetrust/nodetrust/tpm"
	"github.com/nodetrust/nodetrust/tpm/tpmpub"
	"github.com/nodetrust/nodetrust/tpm/tpmtest"
)

// The test bodies below run on a real TPM: swtpm (swtpm_test.go) and the
// in-process simulator (sim_test.go, build tag tpmsim). Nothing of the TPM is
// mocked; the lying helpers are the real server with one answer altered.

// exercise runs every operation of impl once and checks the results as the
// control plane's verifier (package attest) does, so the same evidence comes
// out of a TPM opened directly and of one behind the helper. It closes
// everything it loads.
func exercise(t *testing.T, impl agent.TPM, direct *tpm.TPM) {
	t.Helper()
	ctx := context.Background()

	// The node key: a crypto.Signer the standard library accepts.
	key, rec, err := impl.NewNodeKey(ctx)
	if err != nil {
		t.Fatalf("NewNodeKey: %v", err)
	}
	defer key.Close()
	if err := tpm.CheckNodeKeyAttributes(key.PublicArea()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rec.Name, key.Name()) || rec.Unique() == nil || !bytes.Equal(key.Record().Name, key.Name()) {
		t.Fatalf("the record names %x, the key is %x", rec.Name, key.Name())
	}
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "node"}}, key)
	if err != nil {
		t.Fatalf("a CSR signed by the node key: %v", err)
	}
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		t.Fatal(err)
	}
	if err := csr.CheckSignature(); err != nil {
		t.Fatalf("the CSR's signature: %v", err)
	}
	digest := sha256.Sum256([]byte("statement"))
	sig, err := key.SignContext(ctx, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	if !ecdsa.VerifyASN1(key.Public().(*ecdsa.PublicKey), digest[:], sig) {
		t.Fatal("the signature does not verify with the node key")
	}

	// The key is in the TPM: the TPM derives it again from the record.
	again, err := direct.LoadNodeKey(ctx, rec)
	if err != nil {
		t.Fatalf("derive the record again in the TPM: %v", err)
	}
	if !bytes.Equal(again.PublicArea(), key.PublicArea()) {
		t.Fatal("the TPM derives another key from the record")
	}
	again.Close()
	loaded, err := impl.LoadNodeKey(ctx, rec)
	if err != nil {
		t.Fatalf("LoadNodeKey: %v", err)
	}
	if !bytes.Equal(loaded.PublicArea(), key.PublicArea()) {
		t.Fatal("LoadNodeKey derived another key")
	}
	if err := loaded.Close(); err != nil {
		t.Fatal(err)
	}

	// A record naming another key: the TPM was cleared.
	changed := rec
	changed.Name = append([]byte{0, 0x0b}, bytes.Repeat([]byte{7}, 32)...)
	if k, err := impl.LoadNodeKey(ctx, changed); !errors.Is(err, tpm.ErrKeyChanged) {
		if k != nil {
			k.Close()
		}
		t.Fatalf("LoadNodeKey of a record naming another key: %v, want ErrKeyChanged", err)
	}

	// The AK certifies the node key over sha256(csr).
	ak, akRec, err := impl.NewAK(ctx)
	if err != nil {
		t.Fatalf("NewAK: %v", err)
	}
	defer ak.Close()
	if err := tpm.CheckAKAttributes(ak.PublicArea()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(akRec.Name, ak.Name()) {
		t.Fatal("the AK record names another AK")
	}
	ak2, err := impl.LoadAK(ctx, akRec)
	if err != nil {
		t.Fatalf("LoadAK: %v", err)
	}
	if !bytes.Equal(ak2.Name(), ak.Name()) {
		t.Fatal("LoadAK derived another AK")
	}
	csrHash := sha256.Sum256(csrDER)
	at, atSig, err := impl.Certify(ctx, ak2, key, csrHash[:])
	if err != nil {
		t.Fatalf("Certify: %v", err)
	}
	certified, err := attest.VerifyCertify(ak.PublicArea(), at, atSig, key.PublicArea(), csrHash[:])
	if err != nil {
		t.Fatalf("the verifier refuses the certification: %v", err)
	}
	if !certified.(*ecdsa.PublicKey).Equal(key.Public()) {
		t.Fatal("the certification is of another key")
	}
	if err := ak2.Close(); err != nil {
		t.Fatal(err)
	}

	// The tpm attestor's evidence: EK certificates, the EK, credential
	// activation and the boot quote.
	certs, err := impl.EKCertificates(ctx)
	if err != nil {
		t.Fatalf("EKCertificates: %v", err)
	}
	want, err := direct.EKCertificates(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(certs) != len(want) {
		t.Fatalf("%d EK certificates, the TPM holds %d", len(certs), len(want))
	}
	for idx, der := range want {
		if !bytes.Equal(certs[idx], der) {
			t.Fatalf("the EK certificate at %#x differs", idx)
		}
	}
	ek, err := impl.EK(ctx, tpm.EKAuto)
	if err != nil {
		t.Fatalf("EK: %v", err)
	}
	wantEK, err := direct.EK(ctx, tpm.EKAuto)
	if err != nil {
		t.Fatal(err)
	}
	if ek.Kind != wantEK.Kind || !bytes.Equal(ek.Name, wantEK.Name) || !bytes.Equal(ek.PublicArea, wantEK.PublicArea) {
		t.Fatalf("EK %s %x, the TPM's %s %x", ek.Kind, ek.Name, wantEK.Kind, wantEK.Name)
	}
	if der, ok := certs[ek.Kind.CertIndex()]; ok {
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		if !ek.Public.(interface{ Equal(crypto.PublicKey) bool }).Equal(cert.PublicKey) {
			t.Fatal("the EK is not the one its certificate certifies")
		}
	}
	secret := []byte("the verifier's secret, 32 bytes!")
	blob, encSecret, err := tpmtest.MakeCredential(ek.PublicArea, ak.Name(), secret)
	if err != nil {
		t.Fatal(err)
	}
	got, err := impl.ActivateCredential(ctx, ak, ek, blob, encSecret)
	if err != nil {
		t.Fatalf("ActivateCredential: %v", err)
	}
	if !bytes.Equal(got, secret) {
		t.Fatal("ActivateCredential recovered another secret")
	}
	otherEK := *ek
	otherEK.Name = append([]byte{0, 0x0b}, bytes.Repeat([]byte{9}, 32)...)
	if _, err := impl.ActivateCredential(ctx, ak, &otherEK, blob, encSecret); !errors.Is(err, tpm.ErrEKChanged) {
		t.Fatalf("ActivateCredential with an EK the TPM does not derive: %v, want ErrEKChanged", err)
	}
	nonce := []byte("a fresh nonce from the verifier.")
	quoted, qSig, values, err := impl.Quote(ctx, ak, nonce, tpm.BootPCRs)
	if err != nil {
		t.Fatalf("Quote: %v", err)
	}
	if err := attest.VerifyQuote(ak.PublicArea(), quoted, qSig, nonce, values); err != nil {
		t.Fatalf("the verifier refuses the quote: %v", err)
	}
}

// testRoundTrip runs every operation through a helper on a real unix
// socket, and the same through Direct, and shows that release flushes.
func testRoundTrip(t *testing.T, tt testTPM) {
	p := startHelper(t, tt, Config{AllowedUID: 4242}, hooks{}, "")
	c := dial(t, p, 0)

	t.Run("direct", func(t *testing.T) {
		exercise(t, agent.Direct(tt.tp), tt.tp)
		tt.requireHandles(t, 0)
	})
	t.Run("through the helper", func(t *testing.T) {
		exercise(t, c, tt.tp)
		// Every key was released: the helper flushed it.
		tt.requireHandles(t, 0)
	})
	t.Run("a new key the helper makes", func(t *testing.T) {
		// The client makes its records itself; the protocol also lets
		// the helper make one.
		ctx := context.Background()
		for _, op := range []string{opNodeKey, opAK} {
			resp, err := c.call(ctx, &request{Op: op})
			if err != nil {
				t.Fatal(err)
			}
			rec, err := tpm.ParseKeyRecord(resp.Record)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := checkDerived(op, tpm.KeyRecord{Kind: rec.Kind, Hierarchy: rec.Hierarchy, Template: rec.Template}, resp); err != nil {
				t.Fatal(err)
			}
			tt.requireHandles(t, 1)
			if _, err := c.call(ctx, &request{Op: opRelease, Unique: rec.Unique()}); err != nil {
				t.Fatal(err)
			}
			tt.requireHandles(t, 0)
		}
	})
	t.Run("release", func(t *testing.T) {
		ctx := context.Background()
		key, _, err := c.NewNodeKey(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ak, _, err := c.NewAK(ctx)
		if err != nil {
			t.Fatal(err)
		}
		tt.requireHandles(t, 2)
		if err := key.Close(); err != nil {
			t.Fatal(err)
		}
		tt.requireHandles(t, 1)
		if err := ak.Close(); err != nil {
			t.Fatal(err)
		}
		tt.requireHandles(t, 0)
		if err := key.Close(); err != nil {
			t.Fatalf("Close twice: %v", err)
		}
		digest := sha256.Sum256(nil)
		if _, err := key.SignContext(ctx, digest[:]); !errors.Is(err, ErrClosed) {
			t.Fatalf("Sign after Close: %v, want ErrClosed", err)
		}
		// A release of a key the helper does not hold succeeds.
		if _, err := c.call(ctx, &request{Op: opRelease, Unique: make([]byte, tpm.UniqueSize)}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("bad requests", func(t *testing.T) {
		ctx := context.Background()
		for _, req := range []*request{
			{Op: "tpm.clear"},
			{Op: opSign, Unique: []byte("short"), Digest: make([]byte, 32)},
			{Op: opSign, Unique: make([]byte, tpm.UniqueSize), Digest: make([]byte, 20)},
			{Op: opNodeKey, Record: []byte("-----BEGIN NODETRUST TPM KEY-----\nAAAA\n-----END NODETRUST TPM KEY-----\n")},
			{Op: opQuote, AK: make([]byte, tpm.UniqueSize), Nonce: []byte("n"), PCRs: []int{1, 1}},
			{Op: opActivate, AK: make([]byte, tpm.UniqueSize), EKKind: "auto"},
		} {
			_, err := c.call(ctx, req)
			var he *HelperError
			if !errors.As(err, &he) || he.Code != codeBadRequest {
				t.Errorf("%+v: %v, want a bad_request", req, err)
			}
		}
		// An AK record sent as a node key's.
		a, akRec, err := tt.tp.NewAK(ctx)
		if err != nil {
			t.Fatal(err)
		}
		a.Close()
		pem, err := tpm.MarshalKeyRecord(akRec)
		if err != nil {
			t.Fatal(err)
		}
		var he *HelperError
		if _, err := c.call(ctx, &request{Op: opNodeKey, Record: pem}); !errors.As(err, &he) || he.Code != codeBadRequest {
			t.Errorf("tpm.nodekey with an AK record: %v, want a bad_request", err)
		}
		// A key the helper does not hold.
		digest := sha256.Sum256(nil)
		if _, err := c.call(ctx, &request{Op: opSign, Unique: make([]byte, tpm.UniqueSize), Digest: digest[:]}); !errors.Is(err, ErrUnknownKey) {
			t.Errorf("tpm.sign of an unknown key: %v, want ErrUnknownKey", err)
		}
	})
}

// testLRU shows that the helper keeps at most MaxLoaded keys loaded, and
// derives an evicted key again when a call names it.
func testLRU(t *testing.T, tt testTPM) {
	ctx := context.Background()
	p := startHelper(t, tt, Config{MaxLoaded: 2}, hooks{}, "")
	c := dial(t, p, 0)
	var keys []tpm.NodeKey
	for range 4 {
		k, _, err := c.NewNodeKey(ctx)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
		tt.maxHandles(t, 2)
	}
	ak, _, err := c.NewAK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		for i, k := range keys {
			digest := sha256.Sum256([]byte{byte(round), byte(i)})
			if _, err := k.SignContext(ctx, digest[:]); err != nil {
				t.Fatalf("key %d, evicted and derived again: %v", i, err)
			}
			tt.maxHandles(t, 2)
			qd := sha256.Sum256([]byte{byte(i)})
			if _, _, err := c.Certify(ctx, ak, k, qd[:]); err != nil {
				t.Fatalf("certify key %d: %v", i, err)
			}
			tt.maxHandles(t, 2)
		}
	}
	for _, k := range keys {
		if err := k.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if err := ak.Close(); err != nil {
		t.Fatal(err)
	}
	tt.requireHandles(t, 0)
}

// testHelperRestart shows that a client outlives a helper restart: its
// keys are derived again from their records, and must be the same keys.
func testHelperRestart(t *testing.T, tt testTPM) {
	ctx := context.Background()
	dir := t.TempDir()
	p := startHelper(t, tt, Config{}, hooks{}, dir)
	c := dial(t, p, 0)
	key, _, err := c.NewNodeKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ak, _, err := c.NewAK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tt.requireHandles(t, 2)
	if err := p.stop(); err != nil {
		t.Fatal(err)
	}
	// Serve flushed what it loaded.
	tt.requireHandles(t, 0)
	startHelper(t, tt, Config{}, hooks{}, dir)
	digest := sha256.Sum256([]byte("after a restart"))
	if _, err := key.SignContext(ctx, digest[:]); err != nil {
		t.Fatalf("sign after the helper restarted: %v", err)
	}
	if _, _, err := c.Certify(ctx, ak, key, digest[:]); err != nil {
		t.Fatalf("certify after the helper restarted: %v", err)
	}
	key.Close()
	ak.Close()
	tt.requireHandles(t, 0)
}

// lie is one altered answer of a lying helper.
type lie struct {
	name string
	// alter changes the answer to req; it runs in the helper, holding
	// the TPM.
	alter func(t *testing.T, ctx context.Context, s *server, req *request, resp *response)
	// call makes the call the lie answers, on a client of the lying
	// helper, and returns its error.
	call func(t *testing.T, c *Client) error
	// want is in the error's message.
	want string
}

var lies = []lie{
	{
		name: "a signature by another key",
		alter: func(t *testing.T, _ context.Context, _ *server, req *request, resp *response) {
			if req.Op != opSign {
				return
			}
			other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				t.Error(err)
				return
			}
			if resp.Signature, err = ecdsa.SignASN1(rand.Reader, other, req.Digest); err != nil {
				t.Error(err)
			}
		},
		call: func(t *testing.T, c *Client) error {
			key, _, err := c.NewNodeKey(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer key.Close()
			digest := sha256.Sum256([]byte("statement"))
			_, err = key.Sign(rand.Reader, digest[:], crypto.SHA256)
			return err
		},
		want: "the helper's signature is not the node key's",
	},
	{
		name: "a key with other attributes",
		alter: func(t *testing.T, _ context.Context, _ *server, req *request, resp *response) {
			if req.Op != opNodeKey {
				return
			}
			// A key that also decrypts, otherwise consistent: its name
			// and record are recomputed.
			pub, err := tpmpub.Parse(resp.PublicArea)
			if err != nil {
				t.Error(err)
				return
			}
			pub.ObjectAttributes.Decrypt = true
			resp.PublicArea = tpm2.Marshal(pub)
			if resp.Name, err = tpmpub.Name(resp.PublicArea); err != nil {
				t.Error(err)
				return
			}
			rec, err := tpm.ParseKeyRecord(resp.Record)
			if err != nil {
				t.Error(err)
				return
			}
			rec.Name = resp.Name
			if resp.Record, err = tpm.MarshalKeyRecord(rec); err != nil {
				t.Error(err)
			}
		},
		call: func(t *testing.T, c *Client) error {
			key, _, err := c.NewNodeKey(context.Background())
			if err == nil {
				key.Close()
			}
			return err
		},
		want: "the helper's key is not a node key",
	},
	{
		name: "another record's key",
		alter: func(t *testing.T, ctx context.Context, s *server, req *request, resp *response) {
			if req.Op != opNodeKey {
				return
			}
			// A real node key of the TPM, of a unique the helper chose.
			k, rec, err := s.t.NewNodeKey(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			defer k.Close()
			resp.PublicArea, resp.Name = k.PublicArea(), k.Name()
			if resp.Record, err = tpm.MarshalKeyRecord(rec); err != nil {
				t.Error(err)
			}
		},
		call: func(t *testing.T, c *Client) error {
			key, _, err := c.NewNodeKey(context.Background())
			if err == nil {
				key.Close()
			}
			return err
		},
		want: "another record than the node's",
	},
	{
		name: "a certification by another AK",
		alter: func(t *testing.T, ctx context.Context, s *server, req *request, resp *response) {
			if req.Op != opCertify {
				return
			}
			// A real TPM2_Certify of the node's key, by an AK the helper
			// did not announce.
			other, _, err := s.t.NewAK(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			defer other.Close()
			key := s.entries[string(req.Unique)].key
			if resp.Attest, resp.Signature, err = s.t.Certify(ctx, other, key, req.QualifyingData); err != nil {
				t.Error(err)
			}
		},
		call: certifyOnce,
		want: "the helper certified with another AK",
	},
	{
		name: "a certification of another key",
		alter: func(t *testing.T, ctx context.Context, s *server, req *request, resp *response) {
			if req.Op != opCertify {
				return
			}
			other, _, err := s.t.NewNodeKey(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			defer other.Close()
			ak := s.entries[string(req.AK)].ak
			if resp.Attest, resp.Signature, err = s.t.Certify(ctx, ak, other, req.QualifyingData); err != nil {
				t.Error(err)
			}
		},
		call: certifyOnce,
		want: "the helper certified another key",
	},
	{
		name: "a quote by another AK",
		alter: func(t *testing.T, ctx context.Context, s *server, req *request, resp *response) {
			if req.Op != opQuote {
				return
			}
			other, _, err := s.t.NewAK(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			defer other.Close()
			if resp.Quoted, resp.Signature, resp.PCRValues, err = s.t.Quote(ctx, other, req.Nonce, req.PCRs); err != nil {
				t.Error(err)
			}
		},
		call: func(t *testing.T, c *Client) error {
			ak, _, err := c.NewAK(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			defer ak.Close()
			_, _, _, err = c.Quote(context.Background(), ak, []byte("nonce"), tpm.BootPCRs)
			return err
		},
		want: "the helper quoted with another AK",
	},
}

func certifyOnce(t *testing.T, c *Client) error {
	ctx := context.Background()
	key, _, err := c.NewNodeKey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer key.Close()
	ak, _, err := c.NewAK(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ak.Close()
	qd := sha256.Sum256([]byte("csr"))
	_, _, err = c.Certify(ctx, ak, key, qd[:])
	return err
}

// testLyingHelper runs each lie on a lying helper (the real server with one
// answer altered) and shows the client detects it, and that the same call
// succeeds with an honest helper.
func testLyingHelper(t *testing.T, tt testTPM) {
	for _, l := range lies {
		t.Run(l.name, func(t *testing.T) {
			honest := startHelper(t, tt, Config{}, hooks{}, "")
			if err := l.call(t, dial(t, honest, 0)); err != nil {
				t.Fatalf("with an honest helper: %v", err)
			}
			if err := honest.stop(); err != nil {
				t.Fatal(err)
			}

			lying := startHelper(t, tt, Config{}, hooks{alter: func(ctx context.Context, s *server, req *request, resp *response) {
				l.alter(t, ctx, s, req, resp)
			}}, "")
			err := l.call(t, dial(t, lying, 0))
			if !errors.Is(err, ErrUntrustedAnswer) || !strings.Contains(err.Error(), l.want) {
				t.Fatalf("with a lying helper: %v, want ErrUntrustedAnswer: %q", err, l.want)
			}
			t.Logf("detected: %v", err)
			if err := lying.stop(); err != nil {
				t.Fatal(err)
			}
			tt.requireHandles(t, 0)
		})
	}
}

// testTimeout blocks a call in the helper, deterministically, on a channel
// the test holds: the helper answers "timeout" after Config.Timeout, a call
// waiting behind it times out too, and once the TPM is free the helper
// answers again. A client whose own timeout is shorter gives up by itself.
func testTimeout(t *testing.T, tt testTPM) {
	ctx := context.Background()
	const timeout = 200 * time.Millisecond
	release := &request{Op: opRelease, Unique: make([]byte, tpm.UniqueSize)}

	t.Run("the helper's timeout", func(t *testing.T) {
		blocked, unblock := make(chan struct{}), make(chan struct{})
		p := startHelper(t, tt, Config{Timeout: timeout}, blockFirst(opEK, blocked, unblock), "")
		c := dial(t, p, 0)
		var once sync.Once
		free := func() { once.Do(func() { close(unblock) }) }
		defer free()
		errc := make(chan error, 1)
		go func() {
			_, err := c.EKCertificates(ctx)
			errc <- err
		}()
		<-blocked
		err := <-errc
		var he *HelperError
		if !errors.Is(err, ErrTimeout) || !errors.As(err, &he) || he.Code != codeTimeout || !strings.Contains(err.Error(), timeout.String()) {
			t.Fatalf("a hung call: %v, want the helper's timeout after %s", err, timeout)
		}
		// The hung call still holds the TPM: the next call times out
		// waiting for it.
		if _, err := c.call(ctx, release); !errors.Is(err, ErrTimeout) {
			t.Fatalf("a call behind a hung one: %v, want a timeout", err)
		}
		free()
		if _, err := c.call(ctx, release); err != nil {
			t.Fatalf("once the TPM is free: %v", err)
		}
	})

	t.Run("the client's timeout", func(t *testing.T) {
		blocked, unblock := make(chan struct{}), make(chan struct{})
		p := startHelper(t, tt, Config{}, blockFirst(opRelease, blocked, unblock), "") // 30 seconds
		c := dial(t, p, timeout)
		var once sync.Once
		free := func() { once.Do(func() { close(unblock) }) }
		defer free()
		errc := make(chan error, 1)
		go func() {
			_, err := c.call(ctx, release)
			errc <- err
		}()
		<-blocked
		err := <-errc
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a hung call: %v, want the client's timeout", err)
		}
		free()
		// The client dropped the connection; the next call makes another.
		if _, err := c.call(ctx, release); err != nil {
			t.Fatalf("after a timeout: %v", err)
		}
	})
}

// blockFirst is a hook that blocks the first call of op, as a hung TPM
// command would (it ignores its context): it says so on blocked and waits
// for unblock to close.
func blockFirst(op string, blocked, unblock chan struct{}) hooks {
	var once sync.Once
	return hooks{before: func(_ context.Context, o string) {
		if o != op {
			return
		}
		first := false
		once.Do(func() { first = true })
		if first {
			blocked <- struct{}{}
			<-unblock
		}
	}}
}
