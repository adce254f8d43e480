package callsig

import (
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// The replay cache remembers the nonce of each accepted call until the call
// could no longer be accepted anyway, and at least Window after it was seen:
// until max(now, timestamp) + Window, which is at most 2×Window away since
// the timestamp check refuses a timestamp more than Window in the future.
//
// It is split into shards, chosen by the nonce's first byte, each with its
// own lock. A shard keeps a ring of buckets, one map of nonces per
// bucketWidth of expiry time. Dropping a bucket whose expiry has passed
// frees all its entries at once, so expiry costs O(1) per entry, amortised,
// and never walks the entries. A lookup checks the shard's few live
// buckets.
//
// Entries are counted across shards with one atomic counter, which is the
// hard cap: a call whose nonce would go over it is refused instead of
// stored.
const (
	replayShards = 64
	bucketWidth  = int64(5 * time.Second)
	// ringSize must exceed the number of bucket ids live at once,
	// 2×Window/bucketWidth + 1 = 13, so that with a clock that does not go
	// backwards a bucket's slot is free when it is first used.
	ringSize = 16

	// bucketReuseMax is the largest bucket map that is cleared and kept
	// for reuse when its bucket expires; a larger one is dropped, so that
	// a burst does not hold memory after it ends. Kept maps hold at most
	// replayShards×ringSize×mapBytes(bucketReuseMax), about 2 MB.
	bucketReuseMax = 64
)

// replayFixedBytes approximates the memory of a replayCache without its
// maps: the shards with their locks and bucket headers.
const replayFixedBytes = 64 + replayShards*(16+ringSize*(8+8+8))

// DefaultMaxReplayEntries is the default cap on the replay cache: about
// 35,000 calls a second sustained over the Window, and some 40 MB.
const DefaultMaxReplayEntries = 1 << 20

type replayResult int

const (
	replayFresh replayResult = iota
	replaySeen
	replayFull
)

type replayCache struct {
	max  int64
	size atomic.Int64
	// sweptAll is the bucket id of the last sweep of every shard, made
	// when the cache is full, so that it happens at most once a bucket.
	sweptAll atomic.Int64
	shards   [replayShards]replayShard
}

type replayShard struct {
	mu sync.Mutex
	// swept is the current bucket id at the shard's last sweep.
	swept   int64
	buckets [ringSize]replayBucket
}

// replayBucket holds nonces that expire before id×bucketWidth.
type replayBucket struct {
	id int64
	// hwm is the most entries m has held since it was made, which bounds
	// the memory it still holds after clear.
	hwm int
	m   map[[NonceSize]byte]struct{}
}

func newReplayCache(max int) *replayCache {
	return &replayCache{max: int64(max)}
}

// add records nonce for a call with timestamp ts accepted at now (both Unix
// nanoseconds), unless the nonce is already remembered or the cache is full.
func (c *replayCache) add(nonce *[NonceSize]byte, ts, now int64) replayResult {
	cur := currentBucket(now)
	id := floorDiv(satAdd(max(now, ts), int64(Window)), bucketWidth) + 1
	r := c.tryAdd(nonce, id, cur)
	if old := c.sweptAll.Load(); r == replayFull && cur > old && c.sweptAll.CompareAndSwap(old, cur) {
		// Shards sweep themselves on their own adds; before refusing,
		// sweep them all once a bucket, so that expired entries of
		// shards with no recent add do not count.
		c.sweep(cur)
		r = c.tryAdd(nonce, id, cur)
	}
	return r
}

func (c *replayCache) tryAdd(nonce *[NonceSize]byte, id, cur int64) replayResult {
	s := &c.shards[nonce[0]%replayShards]
	s.mu.Lock()
	if cur > s.swept {
		c.size.Add(-int64(s.sweep(cur)))
	}
	for i := range s.buckets {
		if m := s.buckets[i].m; len(m) != 0 {
			if _, ok := m[*nonce]; ok {
				s.mu.Unlock()
				return replaySeen
			}
		}
	}
	if c.size.Add(1) > c.max {
		c.size.Add(-1)
		s.mu.Unlock()
		return replayFull
	}
	b := &s.buckets[uint64(id)%ringSize]
	// An empty slot takes the new id. A slot that still holds live
	// entries of another id (only after the clock went backwards) keeps
	// them for the later of the two expiries: keeping a nonce longer is
	// always safe, dropping it early never is.
	if len(b.m) == 0 || id > b.id {
		b.id = id
	}
	if b.m == nil {
		b.m = make(map[[NonceSize]byte]struct{})
	}
	b.m[*nonce] = struct{}{}
	b.hwm = max(b.hwm, len(b.m))
	s.mu.Unlock()
	return replayFresh
}

// sweep drops the buckets of every shard that expired before bucket cur and
// returns the approximate bytes the cache holds afterwards.
func (c *replayCache) sweep(cur int64) int64 {
	total := int64(replayFixedBytes)
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		if cur > s.swept {
			c.size.Add(-int64(s.sweep(cur)))
		}
		for j := range s.buckets {
			if b := &s.buckets[j]; b.m != nil {
				total += mapBytes(b.hwm)
			}
		}
		s.mu.Unlock()
	}
	return total
}

// sweep drops the shard's buckets that expired before bucket cur and
// returns the number of entries dropped. The caller holds s.mu.
func (s *replayShard) sweep(cur int64) int {
	s.swept = cur
	n := 0
	for i := range s.buckets {
		b := &s.buckets[i]
		if b.id >= cur || len(b.m) == 0 {
			continue
		}
		n += len(b.m)
		if len(b.m) > bucketReuseMax {
			b.m, b.hwm = nil, 0
		} else {
			clear(b.m)
		}
	}
	return n
}

// currentBucket is the smallest bucket id still live at now: bucket id holds
// nonces that expire before id×bucketWidth, and is dropped once now reaches
// that.
func currentBucket(now int64) int64 { return floorDiv(now, bucketWidth) + 1 }

// mapBytes estimates the memory of a map[[16]byte]struct{} that has held n
// entries: Go's maps keep slots in groups of 8 (8 control bytes and 8
// 16-byte keys, 136 bytes), at most 7/8 full, in power-of-two tables of up
// to 1024 slots. Measured with runtime.MemStats, the estimate is within
// about 25% for 100 to 1<<20 entries.
func mapBytes(n int) int64 {
	const mapHeader, tableHeader, slotBytes = 48, 48, 17
	if n == 0 {
		return mapHeader
	}
	slots := max(8, 1<<bits.Len(uint((n*8+6)/7-1)))
	tables := max(1, slots/1024)
	return int64(mapHeader + tables*tableHeader + slots*slotBytes)
}

// floorDiv is a / b rounded toward negative infinity, for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// satAdd is a + b for b >= 0, saturating at math.MaxInt64.
func satAdd(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
