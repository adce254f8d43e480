package callsig

import (
	"math/rand/v2"
	"testing"
	"time"
)

// The replay cache against a model that remembers every nonce exactly until
// max(seen, timestamp) + Window. The cache may remember a nonce longer (its
// buckets are bucketWidth wide), never shorter; with a clock that only goes
// forward it forgets it at most one bucket width late.
func TestReplayCacheMatchesModel(t *testing.T) {
	for _, tc := range []struct {
		name      string
		backwards bool
	}{
		{"with a clock that only goes forward", false},
		{"with a clock that sometimes jumps back", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			c := newReplayCache(1 << 30)
			model := map[[NonceSize]byte]int64{} // nonce -> expiry
			now := testNow.UnixNano()
			w := int64(Window)
			for step := range 200_000 {
				switch r := rng.IntN(100); {
				case r < 10:
					now += rng.Int64N(int64(3 * time.Second))
				case r < 12 && tc.backwards:
					now -= rng.Int64N(int64(40 * time.Second))
				}
				var nonce [NonceSize]byte
				nonce[0] = byte(rng.IntN(4)) // few shards, many collisions
				nonce[1] = byte(rng.IntN(64))
				ts := now + rng.Int64N(2*w+1) - w // within the timestamp window
				exp, known := model[nonce]
				live := known && now <= exp
				got := c.add(&nonce, ts, now)
				switch {
				case live && got != replaySeen:
					t.Fatalf("step %d: nonce %x live until %d (now %d) but the cache says %d", step, nonce[:2], exp, now, got)
				case got == replayFull:
					t.Fatalf("step %d: cache full", step)
				case got == replaySeen && !live && !tc.backwards && now > exp+bucketWidth:
					t.Fatalf("step %d: nonce %x expired at %d, more than a bucket before now %d, but is still remembered", step, nonce[:2], exp, now)
				}
				if got == replayFresh {
					model[nonce] = max(now, ts) + w
				}
				if got := c.size.Load(); got < 0 {
					t.Fatalf("step %d: size %d", step, got)
				}
			}
			// Every entry the counter counts is in a bucket.
			c.sweep(currentBucket(now))
			n := 0
			for i := range c.shards {
				for j := range c.shards[i].buckets {
					n += len(c.shards[i].buckets[j].m)
				}
			}
			if int64(n) != c.size.Load() {
				t.Errorf("size counter %d, buckets hold %d", c.size.Load(), n)
			}
		})
	}
}

// Large buckets are dropped rather than cleared when they expire, so a
// burst does not keep its memory.
func TestReplayCacheReleasesBurstMemory(t *testing.T) {
	c := newReplayCache(1 << 30)
	now := testNow.UnixNano()
	var nonce [NonceSize]byte
	for i := range replayShards * 4 * bucketReuseMax {
		nonce[0], nonce[1], nonce[2] = byte(i), byte(i>>8), byte(i>>16)
		if c.add(&nonce, now, now) != replayFresh {
			t.Fatalf("nonce %d not fresh", i)
		}
	}
	during := c.sweep(currentBucket(now))
	later := now + int64(Window) + bucketWidth
	after := c.sweep(currentBucket(later))
	if c.size.Load() != 0 {
		t.Fatalf("size %d after expiry, want 0", c.size.Load())
	}
	if after >= during || after > replayFixedBytes+replayShards*ringSize*mapBytes(bucketReuseMax) {
		t.Errorf("bytes %d during the burst, %d after it", during, after)
	}
}

func TestMapBytesEstimate(t *testing.T) {
	for _, tc := range []struct{ n, slots int }{
		{1, 8}, {7, 8}, {8, 16}, {14, 16}, {15, 32}, {1000, 2048}, {1 << 20, 1 << 21},
	} {
		want := int64(48 + max(1, tc.slots/1024)*48 + tc.slots*17)
		if got := mapBytes(tc.n); got != want {
			t.Errorf("mapBytes(%d) = %d, want %d (%d slots)", tc.n, got, want, tc.slots)
		}
	}
}
