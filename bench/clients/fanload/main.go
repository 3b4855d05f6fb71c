// fanload: fan-out load client for throng's channel benchmark.
//
// It opens -conns subscriber WebSockets to ws://ADDR/ws/{channel} (channels
// bench-0 .. bench-(K-1), subscriber i on channel i%K; paced at -rate/s, each
// bound to a source address from -source-ips), waits until every dial has
// finished and -settle has passed, then publishes -publish-rate messages/s in
// total, round-robin over the channels, with POST http://ADDR/api/publish/{ch}
// for -warmup + -duration. After publishing stops it waits -grace for the last
// deliveries, closes the subscribers and prints one JSON object on stdout.
//
// Each message is text: "<seq> <unix nanos at send> <padding to -size bytes>",
// seq counting 1, 2, 3, ... per channel, set by the publisher. Per channel one
// publisher goroutine sends one request at a time, so the server sees a
// channel's messages in seq order; -publishers goroutines share the channels.
// The HTTP client keeps connections alive where the server allows it (throng
// answers "Connection: close": then every publish dials anew; the number of
// dials is reported).
//
// Subscribers parse each frame: delivery latency (now - send time; messages
// sent after the warmup), and per subscriber a seq bitmap: duplicates, out of
// order (a seq below the highest seen), and at the end lost = published with a
// 200 answer but never received. With -server-pid the server's utime+stime
// over the measured window gives server CPU per delivery; the client's own
// CPU and the rest of the machine's load are reported too.
//
// -publish-rate 0 is the idle mode: subscribe, wait -settle, sample the
// server's VmRSS (median of -rss-samples; also sampled before the first dial),
// hold -duration, close: server RSS bytes per subscribed connection.
//
// Everything is bounded: dials and requests time out, the windows are fixed,
// the close is forced after a few seconds.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/bits"
	"net"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
)

type config struct {
	addr        string
	prefix      string
	format      string
	conns       int
	channels    int
	rate        float64
	sourceIPs   string
	publishRate float64
	publishers  int
	keepAlive   bool
	size        int
	warmup      time.Duration
	duration    time.Duration
	grace       time.Duration
	settle      time.Duration
	serverPID   int
	clkTck      int
	rssSamples  int
	dialTimeout time.Duration
	reqTimeout  time.Duration
	label       string
}

// ---------------------------------------------------------------- /proc

func procStatFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, errors.New("bad stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return nil, errors.New("short stat")
	}
	return f, nil // f[0] is field 3 (state)
}

// procCPUTicks: utime+stime of pid (clock ticks).
func procCPUTicks(pid int) (int64, error) {
	f, err := procStatFields(pid)
	if err != nil {
		return 0, err
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("bad stat numbers")
	}
	return ut + st, nil
}

func procRSSKB(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			if f := strings.Fields(line); len(f) >= 2 {
				return strconv.ParseInt(f[1], 10, 64)
			}
		}
	}
	return 0, errors.New("no VmRSS")
}

func sampleRSS(pid, n int, gap time.Duration) ([]int64, int64) {
	var out []int64
	for i := 0; i < n; i++ {
		if i > 0 {
			time.Sleep(gap)
		}
		if v, err := procRSSKB(pid); err == nil {
			out = append(out, v)
		}
	}
	if len(out) == 0 {
		return nil, -1
	}
	s := append([]int64(nil), out...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return out, s[len(s)/2]
}

// machineStat: machine-wide busy (all but idle, iowait, steal), irq+softirq,
// steal, in ticks of USER_HZ, from /proc/stat's first line.
type machine struct{ busy, irq, steal int64 }

func machineStat() machine {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return machine{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return machine{}
	}
	n := func(i int) int64 { v, _ := strconv.ParseInt(f[i], 10, 64); return v }
	var tot int64
	for i := 1; i <= 8; i++ {
		tot += n(i)
	}
	return machine{busy: tot - n(4) - n(5) - n(8), irq: n(6) + n(7), steal: n(8)}
}

// othersCPU: utime+stime+cutime+cstime per user-space process except the
// excluded pids (kernel threads skipped).
func othersCPU(exclude ...int) map[int]int64 {
	out := map[int]int64{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
next:
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		for _, x := range exclude {
			if pid == x {
				continue next
			}
		}
		f, err := procStatFields(pid)
		if err != nil {
			continue
		}
		flags, _ := strconv.ParseUint(f[6], 10, 64)
		if flags&0x00200000 != 0 { // PF_KTHREAD
			continue
		}
		var sum int64
		for _, k := range []int{11, 12, 13, 14} {
			v, _ := strconv.ParseInt(f[k], 10, 64)
			sum += v
		}
		out[pid] = sum
	}
	return out
}

func othersDelta(a, b map[int]int64) int64 {
	var d int64
	for pid, v := range b {
		if v0, ok := a[pid]; ok {
			if v > v0 {
				d += v - v0
			}
		} else {
			d += v
		}
	}
	return d
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ---------------------------------------------------------------- addresses

func parseSourceIPs(spec string) ([]net.IP, error) {
	if spec == "" {
		return nil, nil
	}
	var out []net.IP
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a := net.ParseIP(lo).To4()
		if a == nil {
			return nil, fmt.Errorf("bad source ip %q", lo)
		}
		if !isRange {
			out = append(out, a)
			continue
		}
		b := net.ParseIP(hi).To4()
		if b == nil {
			return nil, fmt.Errorf("bad source ip %q", hi)
		}
		x := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
		y := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
		if y < x || y-x > 1<<16 {
			return nil, fmt.Errorf("bad source range %q", part)
		}
		for v := x; v <= y; v++ {
			out = append(out, net.IPv4(byte(v>>24), byte(v>>16), byte(v>>8), byte(v)).To4())
		}
	}
	return out, nil
}

// ---------------------------------------------------------------- histogram
// Log-linear buckets (64 per power of two, ~1.6% relative error) over ns.

const histBuckets = 4096

type hist [histBuckets]uint64

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

func (h *hist) count() (n uint64) {
	for _, c := range h {
		n += c
	}
	return
}

func (h *hist) quantile(q float64) uint64 {
	total := h.count()
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

func (h *hist) max() uint64 {
	for i := histBuckets - 1; i >= 0; i-- {
		if h[i] > 0 {
			return bucketValue(i)
		}
	}
	return 0
}

// shardedHist: concurrent adds with atomics, spread over shards.
const histShards = 16

type shardedHist struct{ s [histShards]hist }

func (h *shardedHist) add(shard int, ns int64) {
	if ns < 0 {
		ns = 0
	}
	atomic.AddUint64(&h.s[shard%histShards][bucketOf(uint64(ns))], 1)
}

func (h *shardedHist) merged() *hist {
	var out hist
	for i := range h.s {
		for b := range out {
			out[b] += atomic.LoadUint64(&h.s[i][b])
		}
	}
	return &out
}

type latency struct {
	Count uint64  `json:"count"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p999"`
	Max   float64 `json:"max"`
}

func summarize(h *hist) latency {
	us := func(ns uint64) float64 { return float64(ns) / 1000 }
	return latency{Count: h.count(), P50: us(h.quantile(0.5)), P90: us(h.quantile(0.9)), P99: us(h.quantile(0.99)),
		P999: us(h.quantile(0.999)), Max: us(h.max())}
}

// ---------------------------------------------------------------- errors

type errCounter struct {
	mu sync.Mutex
	m  map[string]int
}

func (e *errCounter) add(s string) {
	if i := strings.LastIndex(s, ": "); i >= 0 && len(s) > 120 {
		s = s[i+2:]
	}
	e.mu.Lock()
	if e.m == nil {
		e.m = map[string]int{}
	}
	if len(e.m) < 20 || e.m[s] > 0 {
		e.m[s]++
	} else {
		e.m["(other)"]++
	}
	e.mu.Unlock()
}

func (e *errCounter) snapshot() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.m) == 0 {
		return nil
	}
	out := map[string]int{}
	for k, v := range e.m {
		out[k] = v
	}
	return out
}

// ---------------------------------------------------------------- bitsets

const maxSeq = 1 << 24 // a seq above this is malformed (bounds the bitmaps)

type bitset []uint64

func (b *bitset) set(i uint64) (was bool) {
	w := int(i >> 6)
	if w >= len(*b) {
		n := make([]uint64, w+1+w/2)
		copy(n, *b)
		*b = n
	}
	m := uint64(1) << (i & 63)
	was = (*b)[w]&m != 0
	(*b)[w] |= m
	return
}

func (b bitset) word(i int) uint64 {
	if i < len(b) {
		return b[i]
	}
	return 0
}

// ---------------------------------------------------------------- subscribers

type subscriber struct {
	ch        int
	conn      *websocket.Conn
	recv      bitset
	maxSeq    uint64
	n         uint64
	dup       uint64
	ooo       uint64
	malformed uint64
	// closed by the server (or an error) before the client closed it
	lostConn bool
}

type run struct {
	cfg      *config
	ips      []net.IP
	names    []string
	subs     []*subscriber
	lat      shardedHist
	measFrom atomic.Int64 // unix nanos: latency recorded for messages sent at/after this
	closing  atomic.Bool
	delivers atomic.Int64
	connErrs errCounter
	readers  sync.WaitGroup
}

// parseUint parses leading decimal digits of b[i:], returns value and the index after.
func parseUint(b []byte, i int) (uint64, int, bool) {
	start := i
	var v uint64
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		v = v*10 + uint64(b[i]-'0')
		i++
		if i-start > 19 {
			return 0, i, false
		}
	}
	return v, i, i > start
}

var jsonData = []byte(`"data":"`)

func (r *run) read(idx int, s *subscriber) {
	defer r.readers.Done()
	buf := make([]byte, r.cfg.size+512)
	for {
		_, rd, err := s.conn.NextReader()
		if err != nil {
			if !r.closing.Load() {
				s.lostConn = true
				r.connErrs.add(err.Error())
			}
			return
		}
		k, err := io.ReadFull(rd, buf)
		now := time.Now().UnixNano()
		if err == nil { // message longer than the buffer
			io.Copy(io.Discard, rd)
			s.malformed++
			continue
		}
		msg := buf[:k]
		if r.cfg.format == "json" {
			// {"channel":"c","seq":N,"data":"<seq> <nanos> <pad>"}
			j := bytes.Index(msg, jsonData)
			if j < 0 {
				s.malformed++
				continue
			}
			msg = msg[j+len(jsonData):]
		}
		seq, i, ok1 := parseUint(msg, 0)
		var sent uint64
		ok2 := false
		if ok1 && i < len(msg) && msg[i] == ' ' {
			sent, _, ok2 = parseUint(msg, i+1)
		}
		if !ok1 || !ok2 || seq == 0 || seq > maxSeq {
			s.malformed++
			continue
		}
		r.delivers.Add(1)
		s.n++
		if int64(sent) >= r.measFrom.Load() {
			r.lat.add(idx, now-int64(sent))
		}
		if s.recv.set(seq) {
			s.dup++
			continue
		}
		if seq < s.maxSeq {
			s.ooo++
		} else {
			s.maxSeq = seq
		}
	}
}

func (r *run) openAll(dialErrs *errCounter) (opened, failed int64, took time.Duration) {
	cfg := r.cfg
	mk := func(local net.Addr) *websocket.Dialer {
		nd := &net.Dialer{Timeout: cfg.dialTimeout, LocalAddr: local}
		return &websocket.Dialer{NetDialContext: nd.DialContext, HandshakeTimeout: cfg.dialTimeout,
			ReadBufferSize: 1024, WriteBufferSize: 256}
	}
	var dialers []*websocket.Dialer
	if len(r.ips) == 0 {
		dialers = append(dialers, mk(nil))
	}
	for _, ip := range r.ips {
		dialers = append(dialers, mk(&net.TCPAddr{IP: ip}))
	}
	q := ""
	if cfg.format == "json" {
		q = "?format=json"
	}
	var wg sync.WaitGroup
	var nOK, nFail atomic.Int64
	start := time.Now()
	for i := 0; i < cfg.conns; i++ {
		if cfg.rate > 0 {
			due := start.Add(time.Duration(float64(i) / cfg.rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			s := r.subs[i]
			url := "ws://" + cfg.addr + "/ws/" + r.names[s.ch] + q
			c, resp, err := dialers[i%len(dialers)].Dial(url, nil)
			if err != nil {
				if resp != nil {
					err = fmt.Errorf("%w (HTTP %d)", err, resp.StatusCode)
				}
				dialErrs.add(err.Error())
				nFail.Add(1)
				return
			}
			s.conn = c
			nOK.Add(1)
			r.readers.Add(1)
			go r.read(i, s)
		}(i)
		if (i+1)%5000 == 0 {
			fmt.Fprintf(os.Stderr, "fanload: dialed %d/%d\n", i+1, cfg.conns)
		}
	}
	wg.Wait()
	return nOK.Load(), nFail.Load(), time.Since(start)
}

func (r *run) closeAll() (forced bool) {
	r.closing.Store(true)
	msg := websocket.FormatCloseMessage(websocket.CloseNormalClosure, "")
	var cw sync.WaitGroup
	sem := make(chan struct{}, 256)
	for _, s := range r.subs {
		if s.conn == nil {
			continue
		}
		cw.Add(1)
		sem <- struct{}{}
		go func(c *websocket.Conn) {
			defer func() { <-sem; cw.Done() }()
			c.WriteControl(websocket.CloseMessage, msg, time.Now().Add(time.Second))
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
		}(s.conn)
	}
	cw.Wait()
	done := make(chan struct{})
	go func() { r.readers.Wait(); close(done) }()
	select {
	case <-done:
		return false
	case <-time.After(4 * time.Second):
		for _, s := range r.subs {
			if s.conn != nil {
				s.conn.Close()
			}
		}
		select {
		case <-done:
		case <-time.After(2 * time.Second):
		}
		return true
	}
}

// ---------------------------------------------------------------- publishing

type pubStats struct {
	ok, failed, skipped, seqMismatch, dials atomic.Int64
	errs                                    errCounter
	rtt                                     shardedHist
}

type chanState struct {
	next uint64 // last seq used (owned by one publisher goroutine)
	ok   bitset // seqs the server answered 200 for
}

type result struct {
	Label              string         `json:"label,omitempty"`
	Mode               string         `json:"mode"`
	Addr               string         `json:"addr"`
	Format             string         `json:"format"`
	Conns              int            `json:"conns_requested"`
	Channels           int            `json:"channels"`
	Rate               float64        `json:"rate"`
	SourceIPs          int            `json:"source_ips"`
	Opened             int64          `json:"opened"`
	Failed             int64          `json:"failed"`
	DialErrors         map[string]int `json:"dial_errors,omitempty"`
	OpenSeconds        float64        `json:"open_seconds"`
	ServerPID          int            `json:"server_pid,omitempty"`
	RSSBeforeKB        int64          `json:"server_rss_before_kb,omitempty"`
	RSSAfterKB         int64          `json:"server_rss_after_kb,omitempty"`
	RSSBeforeSamples   []int64        `json:"server_rss_before_kb_samples,omitempty"`
	RSSAfterSamples    []int64        `json:"server_rss_after_kb_samples,omitempty"`
	RSSBytesPerConn    float64        `json:"server_rss_bytes_per_conn,omitempty"`
	RSSEndKB           int64          `json:"server_rss_end_kb,omitempty"`
	HoldSeconds        float64        `json:"hold_seconds,omitempty"`
	ClosedByServer     int64          `json:"subscribers_closed_by_server"`
	ConnErrors         map[string]int `json:"subscriber_conn_errors,omitempty"`
	CloseForced        bool           `json:"close_forced"`
	ClientRSSKB        int64          `json:"client_rss_kb"`
	Size               int            `json:"size,omitempty"`
	PublishRate        float64        `json:"publish_rate,omitempty"`
	Publishers         int            `json:"publishers,omitempty"`
	KeepAlive          bool           `json:"keepalive,omitempty"`
	WarmupSeconds      float64        `json:"warmup_seconds,omitempty"`
	GraceSeconds       float64        `json:"grace_seconds,omitempty"`
	WindowSeconds      float64        `json:"window_seconds,omitempty"`
	PublishedOK        int64          `json:"published_ok,omitempty"`
	PublishFailed      int64          `json:"publish_failed"`
	PublishSkipped     int64          `json:"publish_skipped"`
	PublishErrors      map[string]int `json:"publish_errors,omitempty"`
	PublishSeqMismatch int64          `json:"publish_seq_mismatch"`
	PublishDials       int64          `json:"publish_dials"`
	PublishedInWindow  int64          `json:"published_in_window,omitempty"`
	PublishPerSec      float64        `json:"publish_per_sec,omitempty"`
	PublishRTTUS       *latency       `json:"publish_rtt_us,omitempty"`
	Expected           uint64         `json:"expected_deliveries,omitempty"`
	Deliveries         int64          `json:"deliveries,omitempty"`
	DeliveriesInWindow int64          `json:"deliveries_in_window,omitempty"`
	DeliveriesInGrace  int64          `json:"deliveries_in_grace"`
	DeliveriesPerSec   float64        `json:"deliveries_per_sec,omitempty"`
	Timeline           []int64        `json:"deliveries_per_second_timeline,omitempty"`
	Lost               uint64         `json:"lost"`
	Duplicated         uint64         `json:"duplicated"`
	OutOfOrder         uint64         `json:"out_of_order"`
	Unconfirmed        uint64         `json:"delivered_unconfirmed"`
	Malformed          uint64         `json:"malformed"`
	SubsWithLoss       int            `json:"subscribers_with_loss"`
	LatencyUS          *latency       `json:"latency_us,omitempty"`
	ClkTck             int            `json:"clk_tck,omitempty"`
	ServerCPUSeconds   float64        `json:"server_cpu_seconds"`
	ServerCPUUSPer     float64        `json:"server_cpu_us_per_delivery"`
	ServerCPUCores     float64        `json:"server_cpu_cores"`
	ClientCPUSeconds   float64        `json:"client_cpu_seconds"`
	ClientCPUUSPer     float64        `json:"client_cpu_us_per_delivery"`
	ClientCPUCores     float64        `json:"client_cpu_cores"`
	MachineBusy        float64        `json:"machine_busy_cpu_seconds"`
	MachineIRQ         float64        `json:"machine_irq_softirq_seconds"`
	MachineSteal       float64        `json:"machine_steal_seconds"`
	OtherProcs         float64        `json:"machine_other_procs_cpu_seconds"`
	Residual           float64        `json:"machine_residual_cpu_seconds"`
	OtherCores         float64        `json:"other_cores"`
}

func postClient(cfg *config, ips []net.IP, ps *pubStats) *http.Client {
	var next atomic.Uint64
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			ps.dials.Add(1)
			d := net.Dialer{Timeout: cfg.dialTimeout}
			if len(ips) > 0 {
				d.LocalAddr = &net.TCPAddr{IP: ips[next.Add(1)%uint64(len(ips))]}
			}
			return d.DialContext(ctx, network, addr)
		},
		DisableKeepAlives:     !cfg.keepAlive,
		DisableCompression:    true,
		MaxIdleConns:          cfg.publishers * 2,
		MaxIdleConnsPerHost:   cfg.publishers * 2,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: cfg.reqTimeout,
	}
	return &http.Client{Transport: tr, Timeout: cfg.reqTimeout}
}

func (r *run) publishOne(hc *http.Client, ps *pubStats, ch int, st *chanState, pad []byte, p int) {
	cfg := r.cfg
	st.next++
	seq := st.next
	body := make([]byte, 0, cfg.size+40)
	body = strconv.AppendUint(body, seq, 10)
	body = append(body, ' ')
	t0 := time.Now()
	body = strconv.AppendInt(body, t0.UnixNano(), 10)
	body = append(body, ' ')
	if len(body) < cfg.size {
		body = append(body, pad[:cfg.size-len(body)]...)
	}
	req, _ := http.NewRequest("POST", "http://"+cfg.addr+"/api/publish/"+r.names[ch], bytes.NewReader(body))
	req.Header.Set("Content-Type", "text/plain")
	resp, err := hc.Do(req)
	if err != nil {
		ps.failed.Add(1)
		ps.errs.add(err.Error())
		return
	}
	rb, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	ps.rtt.add(p, int64(time.Since(t0)))
	if resp.StatusCode != 200 {
		ps.failed.Add(1)
		ps.errs.add(fmt.Sprintf("HTTP %d: %.80s", resp.StatusCode, strings.TrimSpace(string(rb))))
		return
	}
	var ans struct {
		Seq uint64 `json:"seq"`
	}
	if json.Unmarshal(rb, &ans) != nil || ans.Seq != seq {
		ps.seqMismatch.Add(1)
	}
	st.ok.set(seq)
	ps.ok.Add(1)
}

func main() {
	cfg := &config{}
	flag.StringVar(&cfg.addr, "addr", "127.0.0.1:8080", "server host:port (ws://ADDR/ws/{ch}, http://ADDR/api/publish/{ch})")
	flag.StringVar(&cfg.prefix, "channel-prefix", "bench-", "channel names are PREFIX0 .. PREFIX(K-1)")
	flag.StringVar(&cfg.format, "format", "raw", "raw | json (json: ?format=json, throng only)")
	flag.IntVar(&cfg.conns, "conns", 1000, "subscriber connections")
	flag.IntVar(&cfg.channels, "channels", 1, "channels; subscriber i joins channel i%K")
	flag.Float64Var(&cfg.rate, "rate", 3000, "subscriber connection opening rate per second (0 = unpaced)")
	flag.StringVar(&cfg.sourceIPs, "source-ips", "", "source addresses to bind before connect, e.g. 127.0.0.2-127.0.0.254")
	flag.Float64Var(&cfg.publishRate, "publish-rate", 10, "messages per second in total, round-robin over channels (0 = idle mode)")
	flag.IntVar(&cfg.publishers, "publishers", 16, "publisher goroutines (each owns channels c with c%P == p)")
	flag.BoolVar(&cfg.keepAlive, "keepalive", true, "reuse publish connections where the server allows it")
	flag.IntVar(&cfg.size, "size", 64, "message size in bytes (padded; at least the seq and timestamp)")
	flag.DurationVar(&cfg.warmup, "warmup", time.Second, "publishing before the measured window")
	flag.DurationVar(&cfg.duration, "duration", 10*time.Second, "measured publishing window (idle mode: hold time)")
	flag.DurationVar(&cfg.grace, "grace", 2*time.Second, "wait after publishing stops for the last deliveries")
	flag.DurationVar(&cfg.settle, "settle", time.Second, "wait after all subscribers are open (before RSS sample / publishing)")
	flag.IntVar(&cfg.serverPID, "server-pid", 0, "server pid: VmRSS and utime+stime from /proc")
	flag.IntVar(&cfg.clkTck, "clk-tck", 100, "clock ticks per second (getconf CLK_TCK)")
	flag.IntVar(&cfg.rssSamples, "rss-samples", 5, "server RSS samples (200 ms apart) before and after; median used")
	flag.DurationVar(&cfg.dialTimeout, "dial-timeout", 10*time.Second, "TCP connect + handshake timeout")
	flag.DurationVar(&cfg.reqTimeout, "request-timeout", 5*time.Second, "publish request timeout")
	flag.StringVar(&cfg.label, "label", "", "copied into the output")
	flag.Parse()

	switch {
	case cfg.conns < 1 || cfg.conns > 100000:
		fail("-conns must be 1..100000")
	case cfg.channels < 1 || cfg.channels > cfg.conns:
		fail("-channels must be 1..conns")
	case cfg.duration <= 0 || cfg.duration > 10*time.Minute:
		fail("-duration must be >0 and <=10m")
	case cfg.warmup < 0 || cfg.warmup > time.Minute || cfg.grace < 0 || cfg.grace > time.Minute:
		fail("-warmup and -grace must be 0..1m")
	case cfg.publishRate < 0 || cfg.publishRate > 1e6:
		fail("-publish-rate must be 0..1e6")
	case cfg.publishRate*(cfg.warmup+cfg.duration).Seconds()/float64(cfg.channels) > maxSeq/2:
		fail("too many messages per channel")
	case cfg.publishers < 1 || cfg.publishers > 1024:
		fail("-publishers must be 1..1024")
	case cfg.size < 1 || cfg.size > 60000:
		fail("-size must be 1..60000")
	case cfg.format != "raw" && cfg.format != "json":
		fail("-format must be raw or json")
	}
	if cfg.rssSamples < 1 {
		cfg.rssSamples = 1
	}
	ips, err := parseSourceIPs(cfg.sourceIPs)
	if err != nil {
		fail(err.Error())
	}
	r := &run{cfg: cfg, ips: ips}
	for i := 0; i < cfg.channels; i++ {
		r.names = append(r.names, cfg.prefix+strconv.Itoa(i))
	}
	for i := 0; i < cfg.conns; i++ {
		r.subs = append(r.subs, &subscriber{ch: i % cfg.channels})
	}
	r.measFrom.Store(math.MaxInt64)

	res := result{Label: cfg.label, Mode: "fanout", Addr: cfg.addr, Format: cfg.format, Conns: cfg.conns, Channels: cfg.channels,
		Rate: cfg.rate, SourceIPs: len(ips), ServerPID: cfg.serverPID}
	if cfg.publishRate == 0 {
		res.Mode = "idle"
	}
	if cfg.serverPID > 0 {
		res.RSSBeforeSamples, res.RSSBeforeKB = sampleRSS(cfg.serverPID, cfg.rssSamples, 200*time.Millisecond)
	}
	var dialErrs errCounter
	var took time.Duration
	res.Opened, res.Failed, took = r.openAll(&dialErrs)
	res.OpenSeconds = took.Seconds()
	res.DialErrors = dialErrs.snapshot()
	fmt.Fprintf(os.Stderr, "fanload: opened %d failed %d; settle %s\n", res.Opened, res.Failed, cfg.settle)
	time.Sleep(cfg.settle)
	if cfg.serverPID > 0 {
		res.RSSAfterSamples, res.RSSAfterKB = sampleRSS(cfg.serverPID, cfg.rssSamples, 200*time.Millisecond)
		if res.Opened > 0 && res.RSSBeforeKB > 0 && res.RSSAfterKB > 0 {
			res.RSSBytesPerConn = float64(res.RSSAfterKB-res.RSSBeforeKB) * 1024 / float64(res.Opened)
		}
	}

	if cfg.publishRate == 0 {
		hold := time.Now()
		time.Sleep(cfg.duration)
		res.HoldSeconds = time.Since(hold).Seconds()
	} else if res.Opened > 0 {
		r.publish(&res)
	}
	if cfg.serverPID > 0 {
		if v, err := procRSSKB(cfg.serverPID); err == nil {
			res.RSSEndKB = v
		}
	}
	if v, err := procRSSKB(os.Getpid()); err == nil {
		res.ClientRSSKB = v
	}
	res.CloseForced = r.closeAll()
	res.ConnErrors = r.connErrs.snapshot()
	for _, s := range r.subs {
		if s.lostConn {
			res.ClosedByServer++
		}
	}
	if res.Opened > 0 && cfg.publishRate > 0 {
		r.tally(&res)
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(res); err != nil {
		os.Exit(1)
	}
}

var chans []chanState

func (r *run) publish(res *result) {
	cfg := r.cfg
	ps := &pubStats{}
	hc := postClient(cfg, r.ips, ps)
	chans = make([]chanState, cfg.channels)
	pad := bytes.Repeat([]byte("x"), cfg.size)
	queues := make([]chan int, cfg.publishers)
	var pw sync.WaitGroup
	for p := range queues {
		queues[p] = make(chan int, 4096)
		pw.Add(1)
		go func(p int) {
			defer pw.Done()
			for ch := range queues[p] {
				r.publishOne(hc, ps, ch, &chans[ch], pad, p)
			}
		}(p)
	}
	res.Size, res.PublishRate, res.Publishers, res.KeepAlive = cfg.size, cfg.publishRate, cfg.publishers, cfg.keepAlive
	res.WarmupSeconds, res.GraceSeconds, res.ClkTck = cfg.warmup.Seconds(), cfg.grace.Seconds(), cfg.clkTck

	pubStart := time.Now().Add(20 * time.Millisecond)
	tStart := pubStart.Add(cfg.warmup)
	tEnd := tStart.Add(cfg.duration)
	r.measFrom.Store(tStart.UnixNano())
	fmt.Fprintf(os.Stderr, "fanload: publishing %.0f msg/s over %d channels: warmup %s, window %s\n",
		cfg.publishRate, cfg.channels, cfg.warmup, cfg.duration)

	// Dispatcher: every ms, hand out the messages that are due. A publisher
	// whose queue is full is behind: the message is skipped (counted).
	dispDone := make(chan struct{})
	go func() {
		defer close(dispDone)
		defer func() {
			for _, q := range queues {
				close(q)
			}
		}()
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		interval := float64(time.Second) / cfg.publishRate
		var k int64
		time.Sleep(time.Until(pubStart))
		for {
			now := time.Now()
			if !now.Before(tEnd) {
				return
			}
			for ; pubStart.Add(time.Duration(float64(k) * interval)).Before(now); k++ {
				ch := int(k % int64(cfg.channels))
				select {
				case queues[ch%cfg.publishers] <- ch:
				default:
					ps.skipped.Add(1)
				}
			}
			<-tick.C
		}
	}()

	// Measured window.
	time.Sleep(time.Until(tStart))
	var srv0, srv1 int64
	var srvErr error
	if cfg.serverPID > 0 {
		srv0, srvErr = procCPUTicks(cfg.serverPID)
	}
	cli0 := selfCPU()
	m0 := machineStat()
	oth0 := othersCPU(os.Getpid(), cfg.serverPID)
	d0, p0 := r.delivers.Load(), ps.ok.Load()
	wall0 := time.Now()
	last := d0
	for sec := 1; ; sec++ {
		next := tStart.Add(time.Duration(sec) * time.Second)
		if next.After(tEnd) {
			break
		}
		time.Sleep(time.Until(next))
		v := r.delivers.Load()
		res.Timeline = append(res.Timeline, v-last)
		last = v
	}
	time.Sleep(time.Until(tEnd))
	d1, p1 := r.delivers.Load(), ps.ok.Load()
	oth1 := othersCPU(os.Getpid(), cfg.serverPID)
	m1 := machineStat()
	cli1 := selfCPU()
	if cfg.serverPID > 0 && srvErr == nil {
		srv1, srvErr = procCPUTicks(cfg.serverPID)
	}
	window := time.Since(wall0).Seconds()

	<-dispDone
	waitDone := make(chan struct{})
	go func() { pw.Wait(); close(waitDone) }()
	select { // in-flight requests end within the request timeout
	case <-waitDone:
	case <-time.After(cfg.reqTimeout + time.Second):
	}
	dEndPub := r.delivers.Load()
	time.Sleep(cfg.grace)
	dEnd := r.delivers.Load()

	tck := float64(cfg.clkTck)
	res.WindowSeconds = window
	res.PublishedOK = ps.ok.Load()
	res.PublishFailed, res.PublishSkipped = ps.failed.Load(), ps.skipped.Load()
	res.PublishErrors = ps.errs.snapshot()
	res.PublishSeqMismatch, res.PublishDials = ps.seqMismatch.Load(), ps.dials.Load()
	res.PublishedInWindow = p1 - p0
	res.PublishPerSec = float64(p1-p0) / window
	rtt := summarize(ps.rtt.merged())
	res.PublishRTTUS = &rtt
	res.Deliveries = dEnd
	res.DeliveriesInWindow = d1 - d0
	res.DeliveriesInGrace = dEnd - dEndPub
	res.DeliveriesPerSec = float64(d1-d0) / window
	lat := summarize(r.lat.merged())
	res.LatencyUS = &lat
	res.ClientCPUSeconds = (cli1 - cli0).Seconds()
	res.ClientCPUCores = res.ClientCPUSeconds / window
	res.MachineBusy = float64(m1.busy-m0.busy) / 100 // USER_HZ
	res.MachineIRQ = float64(m1.irq-m0.irq) / 100
	res.MachineSteal = float64(m1.steal-m0.steal) / 100
	res.OtherProcs = float64(othersDelta(oth0, oth1)) / tck
	if d1 > d0 {
		res.ClientCPUUSPer = res.ClientCPUSeconds * 1e6 / float64(d1-d0)
	}
	res.Residual = res.MachineBusy - res.ClientCPUSeconds
	if cfg.serverPID > 0 && srvErr == nil {
		res.ServerCPUSeconds = float64(srv1-srv0) / tck
		res.ServerCPUCores = res.ServerCPUSeconds / window
		res.Residual -= res.ServerCPUSeconds
		if d1 > d0 {
			res.ServerCPUUSPer = res.ServerCPUSeconds * 1e6 / float64(d1-d0)
		}
	}
	// Other load: other user processes, bounded by what the machine did
	// besides server and client (reaped children may overshoot otherwise).
	res.OtherCores = math.Max(0, math.Min(res.OtherProcs, res.Residual)) / window
}

// tally compares what each subscriber received with what was published.
func (r *run) tally(res *result) {
	for _, s := range r.subs {
		if s.conn == nil {
			continue
		}
		ok := chans[s.ch].ok
		var lost, unconf, expected uint64
		n := len(ok)
		if len(s.recv) > n {
			n = len(s.recv)
		}
		for w := 0; w < n; w++ {
			o, g := ok.word(w), s.recv.word(w)
			expected += uint64(bits.OnesCount64(o))
			lost += uint64(bits.OnesCount64(o &^ g))
			unconf += uint64(bits.OnesCount64(g &^ o))
		}
		res.Expected += expected
		res.Lost += lost
		res.Unconfirmed += unconf
		res.Duplicated += s.dup
		res.OutOfOrder += s.ooo
		res.Malformed += s.malformed
		if lost > 0 {
			res.SubsWithLoss++
		}
	}
}

func fail(msg string) {
	fmt.Fprintln(os.Stderr, "fanload:", msg)
	os.Exit(2)
}
