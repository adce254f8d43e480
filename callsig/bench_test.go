package callsig

import (
	"crypto/ed25519"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// benchPayload is a typical small call payload.
var benchPayload = []byte(`{"robot":"robot-1","lease_seconds":30,"reason":"nav goal 42"}`)

// benchCalls signs n distinct calls at the current time, on every CPU, and
// returns them with a verifier (real clock) that knows their sender. Each
// call can be verified once: the full path remembers its nonce.
func benchCalls(b *testing.B, n int) ([]*Envelope, *Verifier, ed25519.PublicKey) {
	b.Helper()
	key := testKey("inst")
	pub := key.Public().(ed25519.PublicKey)
	s, err := NewSigner(SignerConfig{Sender: testInst, Key: key})
	if err != nil {
		b.Fatal(err)
	}
	envs := make([]*Envelope, n)
	var wg sync.WaitGroup
	workers := runtime.GOMAXPROCS(0)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				e, err := s.Sign(testNS, testKeyExp, KindQuery, benchPayload)
				if err != nil {
					panic(err)
				}
				envs[i] = e
			}
		})
	}
	wg.Wait()
	// Room for every call of the run: a run of the parallel benchmark
	// can exceed the default cap within the window.
	v, err := NewVerifier(VerifierConfig{Namespace: testNS, Keys: KeyMap{testInst: pub}, MaxReplayEntries: max(n, DefaultMaxReplayEntries)})
	if err != nil {
		b.Fatal(err)
	}
	return envs, v, pub
}

// BenchmarkVerify is the full verify path of a local call: key lookup,
// signature, namespace, timestamp and replay cache, each call a new one.
func BenchmarkVerify(b *testing.B) {
	b.Run("serial", func(b *testing.B) {
		envs, v, _ := benchCalls(b, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if err := v.Verify(envs[i]); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		reportReplay(b, v)
	})
	b.Run("parallel", func(b *testing.B) {
		envs, v, _ := benchCalls(b, b.N)
		var next atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := v.Verify(envs[next.Add(1)-1]); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.StopTimer()
		reportReplay(b, v)
	})
	// wire adds decoding the envelope, as a daemon receives it.
	b.Run("wire", func(b *testing.B) {
		envs, v, _ := benchCalls(b, b.N)
		wire := make([][]byte, len(envs))
		for i, e := range envs {
			wire[i] = mustMarshal(b, e)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			var e Envelope
			if err := e.UnmarshalBinary(wire[i]); err != nil {
				b.Fatal(err)
			}
			if err := v.Verify(&e); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func reportReplay(b *testing.B, v *Verifier) {
	st := v.ReplayStats()
	if st.Entries > 0 {
		b.ReportMetric(float64(st.Bytes)/float64(st.Entries), "replay-B/entry")
	}
}

// BenchmarkEd25519Verify is the bare ed25519.Verify of the same message
// BenchmarkVerify's calls sign, the floor of the verify path.
func BenchmarkEd25519Verify(b *testing.B) {
	envs, _, pub := benchCalls(b, 1)
	msg := envs[0].appendSigned(nil)
	sig := envs[0].Signature
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !ed25519.Verify(pub, msg, sig) {
				b.Fatal("does not verify")
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !ed25519.Verify(pub, msg, sig) {
					b.Error("does not verify")
					return
				}
			}
		})
	})
}

// BenchmarkVerifyPaired times the full verify path and bare ed25519.Verify
// of the same signed bytes in alternation, call by call, so that both see
// the same interference from other load on the machine, and reports their
// throughput ratio (bare ns / full ns; 1 means no overhead). On a shared
// machine this ratio is steadier than the ratio of two separate runs.
func BenchmarkVerifyPaired(b *testing.B) {
	b.Run("serial", func(b *testing.B) { benchPaired(b, false) })
	b.Run("parallel", func(b *testing.B) { benchPaired(b, true) })
}

func benchPaired(b *testing.B, parallel bool) {
	envs, v, pub := benchCalls(b, b.N)
	msgs := make([][]byte, len(envs))
	for i, e := range envs {
		msgs[i] = e.appendSigned(nil)
	}
	var full, bare atomic.Int64 // nanoseconds
	var next atomic.Int64
	// pair verifies call i both ways, in an order that alternates.
	pair := func(i int) {
		e := envs[i]
		full1 := func() {
			if err := v.Verify(e); err != nil {
				b.Error(err)
			}
		}
		bare1 := func() {
			if !ed25519.Verify(pub, msgs[i], e.Signature) {
				b.Error("does not verify")
			}
		}
		first, second, firstSum, secondSum := full1, bare1, &full, &bare
		if i%2 == 1 {
			first, second, firstSum, secondSum = bare1, full1, &bare, &full
		}
		t0 := time.Now()
		first()
		t1 := time.Now()
		second()
		firstSum.Add(int64(t1.Sub(t0)))
		secondSum.Add(int64(time.Since(t1)))
	}
	b.ReportAllocs()
	b.ResetTimer()
	if parallel {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				pair(int(next.Add(1) - 1))
			}
		})
	} else {
		for i := 0; i < b.N; i++ {
			pair(i)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(full.Load())/float64(b.N), "verify-ns/op")
	b.ReportMetric(float64(bare.Load())/float64(b.N), "ed25519-ns/op")
	b.ReportMetric(float64(bare.Load())/float64(full.Load()), "throughput-ratio")
}

// BenchmarkVerifyMachineProof is the cost of checking a machine proof
// (chain, statement, endorsement) for a call of another machine.
func BenchmarkVerifyMachineProof(b *testing.B) {
	f := newTestFleet(b, testTD)
	p := newTestMachine(b, f.auth.Issuer, testNode, testNS).proof(b, testInst, instPub())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := VerifyMachineProof(p, f.trust, testNS, testNow); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReplayAdd is the replay cache alone, at a steady state of one
// window of entries.
func BenchmarkReplayAdd(b *testing.B) {
	c := newReplayCache(1 << 30)
	now := time.Now().UnixNano()
	step := int64(Window) / 200_000 // 200,000 entries a window
	var nonce [NonceSize]byte
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		nonce[0], nonce[1], nonce[2], nonce[3] = byte(i), byte(i>>8), byte(i>>16), byte(i>>24)
		now += step
		if c.add(&nonce, now, now) != replayFresh {
			b.Fatal("not fresh")
		}
	}
	b.ReportMetric(float64(c.size.Load()), "entries")
}

// BenchmarkUnmarshalEnvelope is decoding one call's envelope.
func BenchmarkUnmarshalEnvelope(b *testing.B) {
	envs, _, _ := benchCalls(b, 1)
	wire := mustMarshal(b, envs[0])
	b.ReportAllocs()
	for b.Loop() {
		var e Envelope
		if err := e.UnmarshalBinary(wire); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerifyRemoteCached times, call by call in alternation, a call
// of another machine whose proof the cache holds (ProofCache.Verify of the
// proof's bytes, then VerifyPeer) and a local call (Verify), each call a
// new one, and reports their cost ratio (remote ns / local ns; the goal is
// at most 1.2).
func BenchmarkVerifyRemoteCached(b *testing.B) {
	f := newTestFleet(b, testTD)
	m := newTestMachine(b, f.auth.Issuer, testNode, testNS)
	proof := mustMarshalProof(b, m.proof(b, testInst, instPub()))
	// Two sets of calls: local ones and remote ones, signed alike.
	local, lv, _ := benchCalls(b, b.N)
	remote, rv, _ := benchCalls(b, b.N)
	cache := NewProofCache(0)
	// The proof's chain is valid around testNow; the calls are signed at
	// the real time, so the proof is checked at testNow, as a fixed clock.
	if _, err := cache.Verify(proof, f.trust, testNS, testNow); err != nil {
		b.Fatal(err)
	}
	var localNs, remoteNs int64
	b.ReportAllocs()
	b.ResetTimer()
	remoteCall := func(i int) {
		peer, err := cache.Verify(proof, f.trust, testNS, testNow)
		if err == nil {
			err = rv.VerifyPeer(remote[i], peer)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	localCall := func(i int) {
		if err := lv.Verify(local[i]); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < b.N; i++ {
		// Alternate the order, so that neither always runs second.
		first, second, firstNs, secondNs := remoteCall, localCall, &remoteNs, &localNs
		if i%2 == 1 {
			first, second, firstNs, secondNs = localCall, remoteCall, &localNs, &remoteNs
		}
		t0 := time.Now()
		first(i)
		t1 := time.Now()
		second(i)
		*firstNs += int64(t1.Sub(t0))
		*secondNs += int64(time.Since(t1))
	}
	b.StopTimer()
	b.ReportMetric(float64(remoteNs)/float64(b.N), "remote-ns/op")
	b.ReportMetric(float64(localNs)/float64(b.N), "local-ns/op")
	b.ReportMetric(float64(remoteNs)/float64(localNs), "remote/local")
}
