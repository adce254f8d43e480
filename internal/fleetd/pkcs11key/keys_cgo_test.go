//go:build cgo

package pkcs11key_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThalesGroup/crypto11"

	"github.com/nodetrust/nodetrust/internal/fleetd/pkcs11key"
	"github.com/nodetrust/nodetrust/internal/fleetd/pkcs11key/softhsmtest"
	"github.com/nodetrust/nodetrust/pki"
)

// clock is a settable clock for the reconnect interval.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// events collects OnChange's events.
type events struct {
	mu  sync.Mutex
	got []pkcs11key.Event
}

func (e *events) add(ev pkcs11key.Event) { e.mu.Lock(); defer e.mu.Unlock(); e.got = append(e.got, ev) }
func (e *events) list() []pkcs11key.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]pkcs11key.Event(nil), e.got...)
}

func newKeys(t *testing.T, cfg pkcs11key.Config) *pkcs11key.Keys {
	t.Helper()
	k := pkcs11key.New(cfg)
	t.Cleanup(func() { k.Close() })
	return k
}

func mustSign(t *testing.T, s crypto.Signer) {
	t.Helper()
	d := sha256.Sum256([]byte("to be signed"))
	sig, err := s.Sign(rand.Reader, d[:], crypto.SHA256)
	if err != nil {
		t.Fatalf("sign: %v", err)
	}
	if !ecdsa.VerifyASN1(s.Public().(*ecdsa.PublicKey), d[:], sig) {
		t.Fatal("the token's signature does not verify under the key's public key")
	}
}

func generate(t *testing.T, k *pkcs11key.Keys, uri, label string) *pki.ExternalKey {
	t.Helper()
	key, err := k.Generate(mustURI(t, uri), label)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

func TestSoftHSMGenerateOpenSign(t *testing.T) {
	hsm := softhsmtest.New(t)
	hsm.Setenv(t)
	tok := hsm.InitToken(t, "fleet")
	var ref string
	t.Run("a key made in the token signs, and only its reference leaves the token", func(t *testing.T) {
		k := newKeys(t, pkcs11key.Config{})
		key := generate(t, k, hsm.URI(tok), "nodetrust-node-ca")
		mustSign(t, key.Signer)
		ref = key.Ref
		if !strings.HasPrefix(ref, "pkcs11:token=fleet;object=nodetrust-node-ca;id=%") || strings.Contains(ref, softhsmtest.PIN) {
			t.Errorf("reference %q", ref)
		}
		if n := tok.ObjectFiles(t); n != 2 {
			t.Errorf("the token holds %d objects, want the key pair's 2", n)
		}
		// The private half is sensitive and cannot be exported: ask the
		// token on a connection of its own.
		c, err := crypto11.Configure(&crypto11.Config{Path: softhsmtest.Module, TokenLabel: "fleet", Pin: softhsmtest.PIN})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		priv, err := c.FindKeyPair(nil, []byte("nodetrust-node-ca"))
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range []struct {
			attr crypto11.AttributeType
			want byte
		}{{crypto11.CkaSensitive, 1}, {crypto11.CkaExtractable, 0}} {
			got, err := c.GetAttribute(priv, a.attr)
			if err != nil || got == nil || len(got.Value) != 1 || got.Value[0] != a.want {
				t.Errorf("attribute %#x = %v, %v; want %d", a.attr, got, err, a.want)
			}
		}
		_, err = k.Generate(mustURI(t, hsm.URI(tok)), "nodetrust-node-ca")
		if err == nil || !strings.Contains(err.Error(), `already holds a key labelled "nodetrust-node-ca"`) {
			t.Errorf("a second key with the same label: %v", err)
		}
		k.Close()
	})
	t.Run("a key may be given its id (a YubiKey's PIV slot), once", func(t *testing.T) {
		k := newKeys(t, pkcs11key.Config{})
		key := generate(t, k, hsm.URI(tok, "id=%02"), "slot-9c")
		if !strings.HasPrefix(key.Ref, "pkcs11:token=fleet;object=slot-9c;id=%02;type=private") {
			t.Errorf("reference %q", key.Ref)
		}
		mustSign(t, key.Signer)
		_, err := k.Generate(mustURI(t, hsm.URI(tok, "id=%02")), "another")
		if err == nil || !strings.Contains(err.Error(), "already holds a key with id 02") {
			t.Errorf("a second key with the same id: %v", err)
		}
		k.Close()
	})
	t.Run("a later process opens it by its reference and signs", func(t *testing.T) {
		k := newKeys(t, pkcs11key.Config{})
		s, err := k.Open(pki.KeyNodeCA, ref)
		if err != nil {
			t.Fatal(err)
		}
		mustSign(t, s)
	})
	t.Run("the module and PIN file may come from the configuration instead", func(t *testing.T) {
		u := mustURI(t, ref)
		u.ModulePath, u.PINSource = "", ""
		k := newKeys(t, pkcs11key.Config{})
		if _, err := k.Open(pki.KeyNodeCA, u.String()); err == nil || !strings.Contains(err.Error(), "set pkcs11.module in fleetd.toml") {
			t.Errorf("no module: %v", err)
		}
		k = newKeys(t, pkcs11key.Config{Module: softhsmtest.Module, PINFile: hsm.PINFile})
		s, err := k.Open(pki.KeyNodeCA, u.String())
		if err != nil {
			t.Fatal(err)
		}
		mustSign(t, s)
	})
	t.Run("a reference to a key that is not there is refused by name", func(t *testing.T) {
		k := newKeys(t, pkcs11key.Config{})
		_, err := k.Open(pki.KeyNodeCA, hsm.URI(tok, "object=nothing"))
		if !errors.Is(err, pki.ErrNoKey) || !strings.Contains(err.Error(), `holds no key pair labelled "nothing"`) {
			t.Errorf("Open = %v", err)
		}
	})
}

func mustURI(t *testing.T, s string) *pkcs11key.URI {
	t.Helper()
	u, err := pkcs11key.ParseURI(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestSoftHSMWrongPINIsRefusedWithTheWayBack(t *testing.T) {
	hsm := softhsmtest.New(t)
	hsm.Setenv(t)
	tok := hsm.InitToken(t, "fleet")
	wrong := filepath.Join(t.TempDir(), "wrong-pin")
	if err := os.WriteFile(wrong, []byte("0000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k := newKeys(t, pkcs11key.Config{Module: softhsmtest.Module, PINFile: wrong})
	_, err := k.Open(pki.KeyNodeCA, "pkcs11:token=fleet;object=x")
	if !errors.Is(err, pkcs11key.ErrPIN) {
		t.Fatalf("Open with a wrong PIN = %v, want ErrPIN", err)
	}
	for _, want := range []string{"CKR_PIN_INCORRECT", wrong, "write the token's user PIN into " + wrong, "does not retry"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	_ = tok
}

func TestSoftHSMTokenGoneAndBack(t *testing.T) {
	hsm := softhsmtest.New(t)
	hsm.Setenv(t)
	online := hsm.InitToken(t, "online")
	other := hsm.InitToken(t, "other")
	clk := &clock{now: time.Unix(1_700_000_000, 0)}
	var ev events
	refs := map[string]string{}
	{
		k := pkcs11key.New(pkcs11key.Config{})
		refs["node"] = generate(t, k, hsm.URI(online), "node-ca").Ref
		refs["join"] = generate(t, k, hsm.URI(online), "join").Ref
		refs["other"] = generate(t, k, hsm.URI(other), "devid").Ref
		k.Close()
	}
	k := newKeys(t, pkcs11key.Config{OnChange: ev.add, Now: clk.Now, RetryInterval: time.Second})
	open := func(name string) crypto.Signer {
		s, err := k.Open(pki.KeyNodeCA, refs[name])
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	node, join, devid := open("node"), open("join"), open("other")
	for _, s := range []crypto.Signer{node, join, devid} {
		mustSign(t, s)
	}

	online.Remove(t)
	d := sha256.Sum256([]byte("x"))
	t.Run("while the token is gone, signing fails with ErrKeyUnavailable and one event says so", func(t *testing.T) {
		_, err := node.Sign(rand.Reader, d[:], crypto.SHA256)
		if !errors.Is(err, pki.ErrKeyUnavailable) || !strings.Contains(err.Error(), `key "node-ca" of pkcs11:token=online`) {
			t.Fatalf("Sign = %v", err)
		}
		// Within the retry interval it fails at once, without touching the token.
		if _, err := join.Sign(rand.Reader, d[:], crypto.SHA256); !errors.Is(err, pki.ErrKeyUnavailable) {
			t.Errorf("second Sign = %v", err)
		}
		clk.Add(2 * time.Second)
		if _, err := join.Sign(rand.Reader, d[:], crypto.SHA256); !errors.Is(err, pki.ErrKeyUnavailable) {
			t.Errorf("Sign after a failed reconnect = %v", err)
		}
		got := ev.list()
		down := 0
		for _, e := range got {
			if e.Available {
				t.Errorf("event %+v says available while the token is gone", e)
			}
			down++
		}
		// One event per token of the module, once.
		if down != 2 {
			t.Errorf("%d events, want 2 (one per token of the module): %+v", down, got)
		}
	})

	online.Restore(t)
	t.Run("once the token is back, the next signature after the interval reconnects and succeeds", func(t *testing.T) {
		clk.Add(2 * time.Second)
		for _, s := range []crypto.Signer{node, join, devid} {
			mustSign(t, s)
		}
		got := ev.list()
		if len(got) != 4 || !got[2].Available || !got[3].Available {
			t.Errorf("events %+v, want 2 unavailable then 2 available", got)
		}
	})
}

// BenchmarkSoftHSMSign measures one P-256 signature by a key in a SoftHSM2
// token through the signer fleetd uses, beside the same signature by a key
// in memory; -cpu 1,2 shows how it scales over the token's sessions.
func BenchmarkSoftHSMSign(b *testing.B) {
	hsm := softhsmtest.New(b)
	b.Setenv("SOFTHSM2_CONF", hsm.Conf)
	tok := hsm.InitToken(b, "bench")
	k := pkcs11key.New(pkcs11key.Config{})
	defer k.Close()
	u, err := pkcs11key.ParseURI(hsm.URI(tok))
	if err != nil {
		b.Fatal(err)
	}
	key, err := k.Generate(u, "bench")
	if err != nil {
		b.Fatal(err)
	}
	soft, err := pki.GenerateKey()
	if err != nil {
		b.Fatal(err)
	}
	d := sha256.Sum256([]byte("x"))
	for _, s := range []struct {
		name   string
		signer crypto.Signer
	}{{"token", key.Signer}, {"memory", soft}} {
		b.Run(s.name, func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := s.signer.Sign(rand.Reader, d[:], crypto.SHA256); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
