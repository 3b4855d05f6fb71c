package loadkit

import (
	"math/bits"
	"sync/atomic"
)

// Log-linear histogram over nanoseconds: 64 buckets per power of two (~1.6%
// relative error), exact below 128.

const histBuckets = 4096

// Hist counts values (ns); not safe for concurrent adds (see ShardedHist).
type Hist [histBuckets]uint64

func bucketOf(v uint64) int {
	if v < 128 {
		return int(v)
	}
	e := bits.Len64(v) - 7
	b := e*64 + int(v>>uint(e))
	if b >= histBuckets {
		b = histBuckets - 1
	}
	return b
}

func bucketValue(b int) uint64 {
	if b < 128 {
		return uint64(b)
	}
	e := b/64 - 1
	return uint64(b-e*64) << uint(e)
}

// Add counts ns (negative counts as 0).
func (h *Hist) Add(ns int64) {
	if ns < 0 {
		ns = 0
	}
	h[bucketOf(uint64(ns))]++
}

// Merge adds o's counts to h.
func (h *Hist) Merge(o *Hist) {
	for i := range h {
		h[i] += o[i]
	}
}

// Count is the number of values.
func (h *Hist) Count() (n uint64) {
	for _, c := range h {
		n += c
	}
	return
}

// Quantile returns the value (ns) at quantile q (0 when empty).
func (h *Hist) Quantile(q float64) uint64 {
	total := h.Count()
	if total == 0 {
		return 0
	}
	rank := uint64(q * float64(total))
	if rank >= total {
		rank = total - 1
	}
	var acc uint64
	for i, c := range h {
		acc += c
		if acc > rank {
			return bucketValue(i)
		}
	}
	return bucketValue(histBuckets - 1)
}

// Max returns the largest value's bucket (0 when empty).
func (h *Hist) Max() uint64 {
	for i := histBuckets - 1; i >= 0; i-- {
		if h[i] > 0 {
			return bucketValue(i)
		}
	}
	return 0
}

// ShardedHist takes concurrent adds (atomics, spread over shards).
const histShards = 16

type ShardedHist struct{ s [histShards]Hist }

// Add counts ns in the given shard (any int; taken modulo the shard count).
func (h *ShardedHist) Add(shard int, ns int64) {
	if ns < 0 {
		ns = 0
	}
	atomic.AddUint64(&h.s[shard%histShards][bucketOf(uint64(ns))], 1)
}

// Merged returns the sum of the shards.
func (h *ShardedHist) Merged() *Hist {
	var out Hist
	for i := range h.s {
		for b := range out {
			out[b] += atomic.LoadUint64(&h.s[i][b])
		}
	}
	return &out
}

// Latency is the JSON summary of a histogram, in microseconds.
type Latency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

// Summarize gives h's percentiles in microseconds.
func Summarize(h *Hist) Latency {
	us := func(ns uint64) float64 { return float64(ns) / 1000 }
	return Latency{P50: us(h.Quantile(0.5)), P90: us(h.Quantile(0.9)), P99: us(h.Quantile(0.99)),
		P999: us(h.Quantile(0.999)), Max: us(h.Max())}
}
