package callsig

import (
	"crypto/ed25519"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

// testDaemon is a daemon's verifier with two local clients, the command
// line and one instance, all on one clock.
type testDaemon struct {
	clock *clock
	v     *Verifier
	cli   *Signer
	inst  *Signer
}

func newTestDaemon(t *testing.T, maxEntries int) *testDaemon {
	t.Helper()
	c := newClock(testNow)
	cliKey, instKey := testKey("cli"), testKey("inst")
	keys := KeyMap{
		testCLI:  cliKey.Public().(ed25519.PublicKey),
		testInst: instKey.Public().(ed25519.PublicKey),
	}
	return &testDaemon{
		clock: c,
		v:     newTestVerifier(t, keys, c.Now, maxEntries),
		cli:   newTestSigner(t, testCLI, cliKey, c.Now),
		inst:  newTestSigner(t, testInst, instKey, c.Now),
	}
}

func TestVerifyAccepts(t *testing.T) {
	tests := []struct {
		name string
		// sign makes the call; the daemon's clock is testNow when it
		// verifies.
		sign func(t *testing.T, d *testDaemon) *Envelope
	}{
		{"a fresh call of the command line is accepted", func(t *testing.T, d *testDaemon) *Envelope {
			return mustSign(t, d.cli, "lease robot-1")
		}},
		{"a fresh call of an instance is accepted", func(t *testing.T, d *testDaemon) *Envelope {
			return mustSign(t, d.inst, "lease robot-1")
		}},
		{"a call with an empty payload is accepted", func(t *testing.T, d *testDaemon) *Envelope {
			return mustSign(t, d.inst, "")
		}},
		{"a call signed exactly 30 s before the daemon's clock is accepted", func(t *testing.T, d *testDaemon) *Envelope {
			d.clock.Set(testNow.Add(-Window))
			defer d.clock.Set(testNow)
			return mustSign(t, d.inst, "x")
		}},
		{"a call signed exactly 30 s after the daemon's clock is accepted", func(t *testing.T, d *testDaemon) *Envelope {
			d.clock.Set(testNow.Add(Window))
			defer d.clock.Set(testNow)
			return mustSign(t, d.inst, "x")
		}},
		{"a call with a payload longer than the stack buffer is accepted", func(t *testing.T, d *testDaemon) *Envelope {
			return mustSign(t, d.inst, string(make([]byte, 10_000)))
		}},
		{"a call with a payload longer than pooled buffers is accepted", func(t *testing.T, d *testDaemon) *Envelope {
			return mustSign(t, d.inst, string(make([]byte, 100_000)))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newTestDaemon(t, 0)
			e := tt.sign(t, d)
			// Through the wire, as a daemon gets it.
			var got Envelope
			if err := got.UnmarshalBinary(mustMarshal(t, e)); err != nil {
				t.Fatalf("UnmarshalBinary: %v", err)
			}
			if err := d.v.Verify(&got); err != nil {
				t.Fatalf("Verify: %v", err)
			}
		})
	}
}

func TestVerifyRefuses(t *testing.T) {
	tests := []struct {
		name   string
		call   func(t *testing.T, d *testDaemon) *Envelope
		check  string
		substr string
	}{
		{
			name:   "a call with no envelope is refused as unsigned",
			call:   func(t *testing.T, d *testDaemon) *Envelope { return nil },
			check:  CheckNoSignature,
			substr: "the call carries no signature",
		},
		{
			name: "a call with no signature is refused",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				e := mustSign(t, d.cli, "x")
				e.Signature = nil
				return e
			},
			check:  CheckNoSignature,
			substr: "built again",
		},
		{
			name: "a signature of the wrong size is malformed",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				e := mustSign(t, d.cli, "x")
				e.Signature = e.Signature[:63]
				return e
			},
			check:  CheckMalformed,
			substr: "signature is 63 bytes, want 64",
		},
		{
			name: "a call with an empty kind is malformed",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				e := mustSign(t, d.cli, "x")
				e.Kind = ""
				return e
			},
			check:  CheckMalformed,
			substr: "kind is missing",
		},
		{
			name: "a call of a sender with no key on the daemon is refused",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				gone := newTestSigner(t, "inst-ended", testKey("ended"), d.clock.Now)
				return mustSign(t, gone, "x")
			},
			check:  CheckUnknownSender,
			substr: `no key for sender "inst-ended"`,
		},
		{
			name: "a call whose payload was changed after signing does not verify",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				e := mustSign(t, d.inst, "lease robot-1")
				e.Payload = []byte("lease robot-2")
				return e
			},
			check:  CheckSignature,
			substr: `does not verify with the key of sender "inst-7f3a"`,
		},
		{
			name: "a call whose key expression was changed after signing does not verify",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				e := mustSign(t, d.inst, "x")
				e.KeyExpr += "/other"
				return e
			},
			check:  CheckSignature,
			substr: "does not verify",
		},
		{
			name: "a call whose timestamp was changed after signing does not verify",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				e := mustSign(t, d.inst, "x")
				e.Timestamp++
				return e
			},
			check:  CheckSignature,
			substr: "does not verify",
		},
		{
			name: "a node calling under the id of the command line is refused",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				// The instance signs with its own key but names the
				// command line as sender.
				impostor := newTestSigner(t, testCLI, testKey("inst"), d.clock.Now)
				return mustSign(t, impostor, "cancel every goal")
			},
			check:  CheckSignature,
			substr: `does not verify with the key of sender "nodetrust-cli"`,
		},
		{
			name: "a node taking over another call's sender field is refused",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				e := mustSign(t, d.inst, "x")
				e.Sender = testCLI
				return e
			},
			check:  CheckSignature,
			substr: `sender "nodetrust-cli"`,
		},
		{
			name: "a call signed for another namespace is refused",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				e, err := d.inst.Sign("other-ns", testKeyExp, KindQuery, nil)
				if err != nil {
					t.Fatal(err)
				}
				return e
			},
			check:  CheckNamespace,
			substr: `signed for namespace "other-ns", not this daemon's "fleet-ns"`,
		},
		{
			name: "a call signed 31 s before the daemon's clock is refused",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				d.clock.Set(testNow.Add(-31 * time.Second))
				defer d.clock.Set(testNow)
				return mustSign(t, d.inst, "x")
			},
			check:  CheckTimestamp,
			substr: "signed 31s before this daemon's clock, more than 30s away",
		},
		{
			name: "a call signed 31 s after the daemon's clock is refused",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				d.clock.Set(testNow.Add(31 * time.Second))
				defer d.clock.Set(testNow)
				return mustSign(t, d.inst, "x")
			},
			check:  CheckTimestamp,
			substr: "signed 31s after this daemon's clock",
		},
		{
			name: "a call signed 1 ns more than 30 s in the past is refused",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				d.clock.Set(testNow.Add(-Window - 1))
				defer d.clock.Set(testNow)
				return mustSign(t, d.inst, "x")
			},
			check:  CheckTimestamp,
			substr: "30.000000001s before",
		},
		{
			name: "a call signed at the far end of time is refused",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				d.clock.Set(time.Unix(0, math.MinInt64))
				defer d.clock.Set(testNow)
				return mustSign(t, d.inst, "x")
			},
			check:  CheckTimestamp,
			substr: "more than 292 years before",
		},
		{
			name: "a replayed call is refused",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				e := mustSign(t, d.inst, "x")
				if err := d.v.Verify(e); err != nil {
					t.Fatalf("first Verify: %v", err)
				}
				d.clock.Add(10 * time.Second)
				return cloneEnvelope(e)
			},
			check:  CheckReplay,
			substr: "the call is replayed",
		},
		{
			name: "another call with a nonce seen in the last 30 s is refused",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				e := mustSign(t, d.inst, "x")
				if err := d.v.Verify(e); err != nil {
					t.Fatalf("first Verify: %v", err)
				}
				d.clock.Add(20 * time.Second)
				// A client that reuses its nonce for a new call.
				s := newTestSigner(t, testInst, testKey("inst"), d.clock.Now)
				s.rand = fixedReader(e.Nonce[:])
				return mustSign(t, s, "y")
			},
			check:  CheckReplay,
			substr: "carried nonce 69",
		},
		{
			name: "a call is refused when the replay cache is full",
			call: func(t *testing.T, d *testDaemon) *Envelope {
				for range 3 {
					if err := d.v.Verify(mustSign(t, d.inst, "x")); err != nil {
						t.Fatalf("Verify: %v", err)
					}
				}
				return mustSign(t, d.cli, "x")
			},
			check:  CheckReplayCacheFull,
			substr: "holds its limit of 3 nonces",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newTestDaemon(t, 3)
			e := tt.call(t, d)
			wantRejection(t, d.v.Verify(e), tt.check, tt.substr)
		})
	}
}

// fixedReader returns the same bytes on every read.
type fixedReader []byte

func (r fixedReader) Read(p []byte) (int, error) { return copy(p, r), nil }

// A refused call leaves no trace in the replay cache: only accepted calls
// are remembered.
func TestRefusedCallsAreNotRemembered(t *testing.T) {
	d := newTestDaemon(t, 0)
	e := mustSign(t, d.inst, "x")
	bad := cloneEnvelope(e)
	bad.Payload = []byte("y")
	wantRejection(t, d.v.Verify(bad), CheckSignature, "does not verify")
	if err := d.v.Verify(e); err != nil {
		t.Fatalf("Verify after a refused copy: %v", err)
	}
	if n := d.v.ReplayStats().Entries; n != 1 {
		t.Errorf("replay cache holds %d entries, want 1", n)
	}
}

func TestReplayEntriesExpireAfterTheWindow(t *testing.T) {
	d := newTestDaemon(t, 0)
	e := mustSign(t, d.inst, "x")
	if err := d.v.Verify(e); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	reuse := func() *Envelope {
		s := newTestSigner(t, testInst, testKey("inst"), d.clock.Now)
		s.rand = fixedReader(e.Nonce[:])
		return mustSign(t, s, "again")
	}

	// Exactly at the end of the window the call itself is still within
	// its timestamp limit, and its nonce is still remembered.
	d.clock.Set(testNow.Add(Window))
	wantRejection(t, d.v.Verify(cloneEnvelope(e)), CheckReplay, "replayed")
	wantRejection(t, d.v.Verify(reuse()), CheckReplay, "replayed")

	// Past the window the old call is refused for its timestamp.
	d.clock.Set(testNow.Add(Window + time.Nanosecond))
	wantRejection(t, d.v.Verify(cloneEnvelope(e)), CheckTimestamp, "before this daemon's clock")

	// Entries are dropped a whole bucket at a time: at the latest one
	// bucket width after they expire.
	d.clock.Set(testNow.Add(Window + time.Duration(bucketWidth)))
	if st := d.v.ReplayStats(); st.Entries != 0 {
		t.Errorf("after the window the replay cache holds %d entries, want 0", st.Entries)
	}
	if err := d.v.Verify(reuse()); err != nil {
		t.Errorf("a new call with the expired nonce: %v", err)
	}
}

// A call signed up to 30 s in the future stays acceptable until its own
// timestamp is 30 s old, so its nonce is kept that long: 60 s after it was
// seen.
func TestFutureCallsAreRememberedUntilTheirOwnWindowEnds(t *testing.T) {
	d := newTestDaemon(t, 0)
	d.clock.Set(testNow.Add(Window))
	e := mustSign(t, d.inst, "x")
	d.clock.Set(testNow)
	if err := d.v.Verify(e); err != nil {
		t.Fatalf("Verify: %v", err)
	}
	d.clock.Set(testNow.Add(2 * Window))
	wantRejection(t, d.v.Verify(cloneEnvelope(e)), CheckReplay, "replayed")
	d.clock.Set(testNow.Add(2*Window + 1))
	wantRejection(t, d.v.Verify(cloneEnvelope(e)), CheckTimestamp, "before")
}

func TestReplayCacheCapRecoversAsEntriesExpire(t *testing.T) {
	d := newTestDaemon(t, 2)
	for range 2 {
		if err := d.v.Verify(mustSign(t, d.inst, "x")); err != nil {
			t.Fatalf("Verify: %v", err)
		}
	}
	wantRejection(t, d.v.Verify(mustSign(t, d.inst, "x")), CheckReplayCacheFull, "try again")
	st := d.v.ReplayStats()
	if st.Entries != 2 || st.MaxEntries != 2 {
		t.Errorf("ReplayStats = %+v, want 2 entries of at most 2", st)
	}
	// The full cache refused the call without remembering it; once the
	// first entries expire, new calls are accepted.
	d.clock.Add(Window + time.Duration(bucketWidth))
	for range 2 {
		if err := d.v.Verify(mustSign(t, d.inst, "x")); err != nil {
			t.Fatalf("Verify after expiry: %v", err)
		}
	}
}

func TestReplayStatsReportsEntriesAndBytes(t *testing.T) {
	d := newTestDaemon(t, 0)
	empty := d.v.ReplayStats()
	if empty.Entries != 0 || empty.MaxEntries != DefaultMaxReplayEntries || empty.Bytes <= 0 {
		t.Fatalf("empty cache: %+v", empty)
	}
	const n = 2000
	for range n {
		if err := d.v.Verify(mustSign(t, d.inst, "x")); err != nil {
			t.Fatalf("Verify: %v", err)
		}
	}
	st := d.v.ReplayStats()
	if st.Entries != n {
		t.Errorf("Entries = %d, want %d", st.Entries, n)
	}
	// Some 17 to 40 bytes an entry on top of the fixed part.
	if per := float64(st.Bytes-empty.Bytes) / n; per < 17 || per > 80 {
		t.Errorf("Bytes grew by %.1f per entry (%+v), want 17 to 80", per, st)
	}
}

// With Start set, a restarted daemon refuses calls signed before it
// started, which its previous process may have accepted.
func TestVerifierStartRefusesCallsOfThePreviousProcess(t *testing.T) {
	c := newClock(testNow)
	key := testKey("inst")
	s := newTestSigner(t, testInst, key, c.Now)
	before := mustSign(t, s, "x")
	c.Add(2 * time.Second)
	v, err := NewVerifier(VerifierConfig{Namespace: testNS, Keys: KeyMap{testInst: key.Public().(ed25519.PublicKey)}, Now: c.Now, Start: c.Now()})
	if err != nil {
		t.Fatal(err)
	}
	wantRejection(t, v.Verify(before), CheckTimestamp, "signed 2s before this daemon started; sign it again")
	if err := v.Verify(mustSign(t, s, "x")); err != nil {
		t.Errorf("a call signed at the start: %v", err)
	}
}

func TestNewVerifierRefusesBadConfig(t *testing.T) {
	keys := KeyMap{}
	tests := []struct {
		name   string
		cfg    VerifierConfig
		substr string
	}{
		{"a verifier needs a namespace", VerifierConfig{Keys: keys}, `namespace "" is empty`},
		{"a verifier needs a key store", VerifierConfig{Namespace: testNS}, "no key store"},
		{"a negative replay cap is refused", VerifierConfig{Namespace: testNS, Keys: keys, MaxReplayEntries: -1}, "MaxReplayEntries is -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewVerifier(tt.cfg)
			if err == nil || !strings.Contains(err.Error(), tt.substr) {
				t.Fatalf("NewVerifier: %v, want an error containing %q", err, tt.substr)
			}
		})
	}
}

func TestKeyOfTheWrongSizeIsRefusedWithoutPanic(t *testing.T) {
	c := newClock(testNow)
	v := newTestVerifier(t, KeyMap{testInst: make(ed25519.PublicKey, 31)}, c.Now, 0)
	e := mustSign(t, newTestSigner(t, testInst, testKey("inst"), c.Now), "x")
	wantRejection(t, v.Verify(e), CheckUnknownSender, "is 31 bytes, not an Ed25519 public key")
}

// Many goroutines verify the same calls at once: each call is accepted
// exactly once.
func TestConcurrentVerifyAcceptsEachCallOnce(t *testing.T) {
	d := newTestDaemon(t, 0)
	const calls, workers = 200, 8
	envs := make([]*Envelope, calls)
	for i := range envs {
		envs[i] = mustSign(t, d.inst, fmt.Sprint(i))
	}
	accepted := make([]int, calls)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i, e := range envs {
				if err := d.v.Verify(cloneEnvelope(e)); err == nil {
					mu.Lock()
					accepted[i]++
					mu.Unlock()
				} else {
					wantRejection(t, err, CheckReplay, "replayed")
				}
			}
		})
	}
	wg.Wait()
	for i, n := range accepted {
		if n != 1 {
			t.Errorf("call %d accepted %d times, want once", i, n)
		}
	}
}
