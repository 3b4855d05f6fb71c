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
// 2xx answer but never received. With -server-pid the server's utime+stime
// (with its child processes: nginx's workers) over the measured window gives
// server CPU per delivery; the client's own
// CPU and the rest of the machine's load are reported too.
//
// -publish-rate 0 is the idle mode: subscribe, wait -settle, sample the
// server's VmRSS (median of -rss-samples; also sampled before the first dial),
// hold -duration, close: server RSS bytes per subscribed connection.
//
// -messages N is the burst mode (bench/burst.sh): N messages back to back (or
// paced at -publish-rate), measured from the first publish until every
// subscriber has every accepted one.
//
// -payload-file FILE publishes realistic messages instead (bench/deflate.py):
// FILE holds one JSON object per line; a channel's message seq is line
// (seq-1) % lines with the seq and send time put in front,
// {"seq":N,"sent":NANOS,<the line after its "{">, so every server gets the same
// sequence. Subscribers read the first 64 bytes of each message for seq and time
// (the rest is skipped unread: with permessage-deflate, not inflated); every
// -verify-every'th subscriber reads each message whole and compares it with the
// line (payload_mismatch).
//
// -deflate offers permessage-deflate on the subscriber connections (gorilla's
// EnableCompression: "permessage-deflate; server_no_context_takeover;
// client_no_context_takeover"); "deflate" in the output says for how many the
// server accepted it and its exact Sec-WebSocket-Extensions answers. Every byte
// the subscribers read from their sockets is counted: wire_bytes_read over the
// measured window (after the handshakes) and wire_bytes_per_delivery, frame
// headers and compression included.
//
// Everything is bounded: dials and requests time out, the windows are fixed,
// the close is forced after a few seconds.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/bits"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"throng-bench/clients/internal/loadkit"
)

type config struct {
	loadkit.Common
	tls         bool
	addr        string
	prefix      string
	format      string
	conns       int
	channels    int
	rate        float64
	publishRate float64
	messages    int
	publishers  int
	keepAlive   bool
	size        int
	warmup      time.Duration
	duration    time.Duration
	grace       time.Duration
	settle      time.Duration
	reqTimeout  time.Duration
	label       string
	deflate     bool
	rxStamps    bool
	payloadFile string
	verifyEvery int
	// payloads: the lines of -payload-file, each without its leading "{".
	payloads [][]byte
}

// prefixRead: what a subscriber reads of a -payload-file message when it does
// not verify it: {"seq":N,"sent":NANOS, fits.
const prefixRead = 64

var (
	seqKey  = []byte(`{"seq":`)
	sentKey = []byte(`,"sent":`)
)

// loadPayloads reads -payload-file: one JSON object per line (blank lines skipped).
func loadPayloads(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out [][]byte
	for n, line := range bytes.Split(b, []byte("\n")) {
		line = bytes.TrimRight(line, "\r")
		if len(line) == 0 {
			continue
		}
		if line[0] != '{' || len(line) < 3 || line[len(line)-1] != '}' || !json.Valid(line) {
			return nil, fmt.Errorf("%s:%d: not a JSON object on one line", path, n+1)
		}
		out = append(out, line[1:])
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no payloads", path)
	}
	return out, nil
}

// tail is what follows {"seq":N,"sent":NANOS, in message seq.
func (c *config) tail(seq uint64) []byte { return c.payloads[(seq-1)%uint64(len(c.payloads))] }

// latency: the shared percentile summary plus the number of values.
type latency struct {
	Count uint64 `json:"count"`
	loadkit.Latency
}

func summarize(h *loadkit.Hist) latency {
	return latency{Count: h.Count(), Latency: loadkit.Summarize(h)}
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
	arrival   *loadkit.RxStamp // with -rx-timestamps: the kernel's receive time of the latest read
	recv      bitset
	maxSeq    uint64
	n         uint64
	dup       uint64
	ooo       uint64
	malformed uint64
	verify    bool   // reads every message whole and compares it (-payload-file)
	verified  uint64 // messages compared
	mismatch  uint64 // of which differed from the payload sent
	// closed by the server (or an error) before the client closed it
	lostConn bool
}

type run struct {
	cfg      *config
	ips      []net.IP
	names    []string
	subs     []*subscriber
	lat      loadkit.ShardedHist
	arrival  loadkit.ShardedHist // with -rx-timestamps: kernel receive time - send time
	measFrom atomic.Int64        // unix nanos: latency recorded for messages sent at/after this
	closing  atomic.Bool
	delivers atomic.Int64
	connErrs loadkit.ErrCounter
	readErrs loadkit.ErrCounter // a message that could not be read (e.g. bad deflate data)
	wire     atomic.Int64       // bytes read from the subscriber sockets
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
				r.connErrs.Add(err.Error())
			}
			return
		}
		if r.cfg.payloads != nil {
			r.readPayload(idx, s, rd, buf)
			continue
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
		r.delivered(idx, s, seq, sent, now)
	}
}

// delivered counts one well-formed delivery of seq, sent at sent (Unix nanos)
// and read at now: its latency, and whether it came twice or out of order.
func (r *run) delivered(idx int, s *subscriber, seq, sent uint64, now int64) {
	r.delivers.Add(1)
	s.n++
	if int64(sent) >= r.measFrom.Load() {
		r.lat.Add(idx, now-int64(sent))
		if s.arrival != nil && s.arrival.Nanos > 0 {
			r.arrival.Add(idx, s.arrival.Nanos-int64(sent))
		}
	}
	if s.recv.set(seq) {
		s.dup++
		return
	}
	if seq < s.maxSeq {
		s.ooo++
	} else {
		s.maxSeq = seq
	}
}

// readPayload takes one -payload-file message: its first prefixRead bytes (the
// whole of it, compared with what was published, for a verifying subscriber).
func (r *run) readPayload(idx int, s *subscriber, rd io.Reader, buf []byte) {
	want := prefixRead
	if s.verify {
		want = len(buf)
	}
	k, err := io.ReadFull(rd, buf[:want])
	now := time.Now().UnixNano()
	switch {
	case err == nil && s.verify: // longer than any message published
		io.Copy(io.Discard, rd)
		s.malformed++
		return
	case err != nil && err != io.EOF && err != io.ErrUnexpectedEOF:
		r.readErrs.Add(err.Error())
		s.malformed++
		return
	}
	msg := buf[:k]
	if !bytes.HasPrefix(msg, seqKey) {
		s.malformed++
		return
	}
	seq, i, ok1 := parseUint(msg, len(seqKey))
	var sent uint64
	ok2 := false
	if ok1 && bytes.HasPrefix(msg[i:], sentKey) {
		sent, i, ok2 = parseUint(msg, i+len(sentKey))
	}
	if !ok1 || !ok2 || seq == 0 || seq > maxSeq || i >= len(msg) || msg[i] != ',' {
		s.malformed++
		return
	}
	if s.verify {
		s.verified++
		if !bytes.Equal(msg[i+1:], r.cfg.tail(seq)) {
			s.mismatch++
		}
	}
	r.delivered(idx, s, seq, sent, now)
}

func (r *run) openAll() loadkit.Opening {
	cfg := r.cfg
	q := ""
	if cfg.format == "json" {
		q = "?format=json"
	}
	o := loadkit.Opener{Prog: "fanload", Conns: cfg.conns, Rate: cfg.rate, IPs: r.ips, Timeout: cfg.DialTimeout,
		ReadBuf: 1024, WriteBuf: 256,
		URL: func(i int) string { return cfg.scheme("ws") + cfg.addr + "/ws/" + r.names[r.subs[i].ch] + q },
		TLS: cfg.TLSConfig("fanload"), Deflate: cfg.deflate, WireRead: &r.wire, RxStamps: cfg.rxStamps}
	return o.Open(func(i int, c *websocket.Conn) {
		s := r.subs[i]
		s.conn = c
		s.arrival = loadkit.Arrival(c)
		r.readers.Add(1)
		go r.read(i, s)
	})
}

func (r *run) closeAll() (forced bool) {
	r.closing.Store(true)
	var conns []*websocket.Conn
	for _, s := range r.subs {
		if s.conn != nil {
			conns = append(conns, s.conn)
		}
	}
	return loadkit.CloseAll(conns, &r.readers)
}

// ---------------------------------------------------------------- publishing

type pubStats struct {
	ok, failed, skipped, seqMismatch, dials atomic.Int64
	bytesOK                                 atomic.Int64 // bodies of the accepted publishes
	errs                                    loadkit.ErrCounter
	rtt                                     loadkit.ShardedHist
}

type chanState struct {
	next uint64       // last seq used (owned by one publisher goroutine)
	ok   bitset       // seqs the server answered 2xx for
	okN  atomic.Int64 // how many: read by the burst's waiter
}

type result struct {
	Label    string  `json:"label,omitempty"`
	Mode     string  `json:"mode"`
	Addr     string  `json:"addr"`
	Format   string  `json:"format"`
	Conns    int     `json:"conns_requested"`
	Channels int     `json:"channels"`
	Rate     float64 `json:"rate"`
	loadkit.Opening
	loadkit.RSSDelta
	RSSEndKB           int64          `json:"server_rss_end_kb,omitempty"`
	HoldSeconds        float64        `json:"hold_seconds,omitempty"`
	ClosedByServer     int64          `json:"subscribers_closed_by_server"`
	ConnErrors         map[string]int `json:"subscriber_conn_errors,omitempty"`
	CloseForced        bool           `json:"close_forced"`
	ClientRSSKB        int64          `json:"client_rss_kb"`
	Size               int            `json:"size,omitempty"`
	PayloadFile        string         `json:"payload_file,omitempty"`
	Payloads           int            `json:"payload_lines,omitempty"`
	PublishedBytesOK   int64          `json:"published_bytes_ok,omitempty"`
	PayloadBytesMean   float64        `json:"payload_bytes_mean,omitempty"`
	HandshakeBytesRead int64          `json:"handshake_bytes_read"`
	WireBytesRead      int64          `json:"wire_bytes_read"`
	WireBytesPer       float64        `json:"wire_bytes_per_delivery"`
	VerifyEvery        int            `json:"verify_every,omitempty"`
	Verified           uint64         `json:"verified_deliveries"`
	PayloadMismatch    uint64         `json:"payload_mismatch"`
	ReadErrors         map[string]int `json:"read_errors,omitempty"`
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
	// ArrivalUS (-rx-timestamps): send time to the kernel's receive time of the
	// read that returned the message's last byte, so without the client's own
	// wait to be scheduled and its parsing; same messages as LatencyUS.
	ArrivalUS        *latency `json:"arrival_us,omitempty"`
	ClkTck           int      `json:"clk_tck,omitempty"`
	ServerCPUSeconds float64  `json:"server_cpu_seconds"`
	ServerSysSeconds float64  `json:"server_cpu_sys_seconds"`
	ServerCPUUSPer   float64  `json:"server_cpu_us_per_delivery"`
	ServerCPUCores   float64  `json:"server_cpu_cores"`
	ClientCPUSeconds float64  `json:"client_cpu_seconds"`
	ClientCPUUSPer   float64  `json:"client_cpu_us_per_delivery"`
	ClientCPUCores   float64  `json:"client_cpu_cores"`
	MachineBusy      float64  `json:"machine_busy_cpu_seconds"`
	MachineIRQ       float64  `json:"machine_irq_softirq_seconds"`
	MachineSteal     float64  `json:"machine_steal_seconds"`
	OtherProcs       float64  `json:"machine_other_procs_cpu_seconds"`
	Residual         float64  `json:"machine_residual_cpu_seconds"`
	OtherCores       float64  `json:"other_cores"`
}

// scheme is "ws://" or "http://", or with -tls "wss://" or "https://".
func (c *config) scheme(plain string) string {
	if c.tls {
		return plain + "s://"
	}
	return plain + "://"
}

func postClient(cfg *config, ips []net.IP, ps *pubStats) *http.Client {
	var next atomic.Uint64
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			ps.dials.Add(1)
			d := net.Dialer{Timeout: cfg.DialTimeout}
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
		TLSClientConfig:       cfg.TLSConfig("fanload"),
	}
	return &http.Client{Transport: tr, Timeout: cfg.reqTimeout}
}

func (r *run) publishOne(hc *http.Client, ps *pubStats, ch int, st *chanState, pad []byte, p int) {
	cfg := r.cfg
	st.next++
	seq := st.next
	body := make([]byte, 0, cfg.size+40)
	var t0 time.Time
	if cfg.payloads != nil {
		body = append(body, seqKey...)
		body = strconv.AppendUint(body, seq, 10)
		body = append(body, sentKey...)
		t0 = time.Now()
		body = strconv.AppendInt(body, t0.UnixNano(), 10)
		body = append(body, ',')
		body = append(body, cfg.tail(seq)...)
	} else {
		body = strconv.AppendUint(body, seq, 10)
		body = append(body, ' ')
		t0 = time.Now()
		body = strconv.AppendInt(body, t0.UnixNano(), 10)
		body = append(body, ' ')
		if len(body) < cfg.size {
			body = append(body, pad[:cfg.size-len(body)]...)
		}
	}
	req, _ := http.NewRequest("POST", cfg.scheme("http")+cfg.addr+"/api/publish/"+r.names[ch], bytes.NewReader(body))
	req.Header.Set("Content-Type", "text/plain")
	resp, err := hc.Do(req)
	if err != nil {
		ps.failed.Add(1)
		ps.errs.Add(err.Error())
		return
	}
	rb, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	ps.rtt.Add(p, int64(time.Since(t0)))
	// Any 2xx is an accepted publish (Nchan answers 201 or 202 with channel info).
	if resp.StatusCode/100 != 2 {
		ps.failed.Add(1)
		ps.errs.Add(fmt.Sprintf("HTTP %d: %.80s", resp.StatusCode, strings.TrimSpace(string(rb))))
		return
	}
	// A server that answers with its own seq (throng, the hubs) must agree with ours.
	var ans struct {
		Seq *uint64 `json:"seq"`
	}
	if json.Unmarshal(rb, &ans) == nil && ans.Seq != nil && *ans.Seq != seq {
		ps.seqMismatch.Add(1)
	}
	st.ok.set(seq)
	st.okN.Add(1)
	ps.ok.Add(1)
	ps.bytesOK.Add(int64(len(body)))
}

func main() {
	cfg := &config{}
	flag.StringVar(&cfg.addr, "addr", "127.0.0.1:8080", "server host:port (ws://ADDR/ws/{ch}, http://ADDR/api/publish/{ch})")
	flag.BoolVar(&cfg.tls, "tls", false, "subscribe with wss:// and publish with https:// (with -ca or -insecure for a test certificate)")
	flag.StringVar(&cfg.prefix, "channel-prefix", "bench-", "channel names are PREFIX0 .. PREFIX(K-1)")
	flag.StringVar(&cfg.format, "format", "raw", "raw | json (json: ?format=json, throng only)")
	flag.IntVar(&cfg.conns, "conns", 1000, "subscriber connections")
	flag.IntVar(&cfg.channels, "channels", 1, "channels; subscriber i joins channel i%K")
	flag.Float64Var(&cfg.rate, "rate", 3000, "subscriber connection opening rate per second (0 = unpaced)")
	flag.Float64Var(&cfg.publishRate, "publish-rate", 10, "messages per second in total, round-robin over channels (0 = idle mode)")
	flag.IntVar(&cfg.messages, "messages", 0, "burst mode: publish this many messages in total at full speed (each publisher one request at a time; "+
		"a -publish-rate above 0 paces them instead; -warmup unused, -duration bounds the publishing) and measure until every subscriber has them")
	flag.IntVar(&cfg.publishers, "publishers", 16, "publisher goroutines (each owns channels c with c%P == p)")
	flag.BoolVar(&cfg.keepAlive, "keepalive", true, "reuse publish connections where the server allows it")
	flag.IntVar(&cfg.size, "size", 64, "message size in bytes (padded; at least the seq and timestamp)")
	flag.DurationVar(&cfg.warmup, "warmup", time.Second, "publishing before the measured window")
	flag.DurationVar(&cfg.duration, "duration", 10*time.Second, "measured publishing window (idle mode: hold time)")
	flag.DurationVar(&cfg.grace, "grace", 2*time.Second, "wait after publishing stops for the last deliveries")
	flag.DurationVar(&cfg.settle, "settle", time.Second, "wait after all subscribers are open (before RSS sample / publishing)")
	flag.DurationVar(&cfg.reqTimeout, "request-timeout", 5*time.Second, "publish request timeout")
	flag.StringVar(&cfg.label, "label", "", "copied into the output")
	flag.BoolVar(&cfg.rxStamps, "rx-timestamps", false, "subscribers read with recvmsg and SO_TIMESTAMPNS, and the output adds arrival_us: each message's latency to the kernel's receive time, without the client's own scheduling and parsing")
	flag.BoolVar(&cfg.deflate, "deflate", false, "subscribers offer permessage-deflate (server_no_context_takeover; client_no_context_takeover); the output says what the server answered")
	flag.StringVar(&cfg.payloadFile, "payload-file", "", "publish these messages: one JSON object per line, message seq = line (seq-1)%lines with {\"seq\":N,\"sent\":NANOS, in front (-size unused)")
	flag.IntVar(&cfg.verifyEvery, "verify-every", 1, "with -payload-file: every Nth subscriber reads each message whole and compares it with the payload (the others read its first 64 bytes)")
	cfg.Register()
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
	case cfg.messages < 0 || cfg.messages/cfg.channels > maxSeq/2:
		fail("-messages must be 0.. (too many per channel)")
	case cfg.publishRate*(cfg.warmup+cfg.duration).Seconds()/float64(cfg.channels) > maxSeq/2:
		fail("too many messages per channel")
	case cfg.publishers < 1 || cfg.publishers > 1024:
		fail("-publishers must be 1..1024")
	case cfg.size < 1 || cfg.size > 60000:
		fail("-size must be 1..60000")
	case cfg.format != "raw" && cfg.format != "json":
		fail("-format must be raw or json")
	case cfg.verifyEvery < 1:
		fail("-verify-every must be at least 1")
	case cfg.payloadFile != "" && cfg.format != "raw":
		fail("-payload-file needs -format raw")
	}
	if cfg.payloadFile != "" {
		var err error
		if cfg.payloads, err = loadPayloads(cfg.payloadFile); err != nil {
			fail(err.Error())
		}
		// The largest message: its line plus {"seq":N,"sent":NANOS, (at most 7+8+8+19+1).
		cfg.size = 0
		for _, p := range cfg.payloads {
			if len(p)+prefixRead > cfg.size {
				cfg.size = len(p) + prefixRead
			}
		}
		if cfg.size > 60000 {
			fail("-payload-file: a line is longer than 60000 bytes")
		}
	}
	ips := cfg.Check("fanload")
	r := &run{cfg: cfg, ips: ips}
	for i := 0; i < cfg.channels; i++ {
		r.names = append(r.names, cfg.prefix+strconv.Itoa(i))
	}
	for i := 0; i < cfg.conns; i++ {
		r.subs = append(r.subs, &subscriber{ch: i % cfg.channels, verify: cfg.payloads != nil && i%cfg.verifyEvery == 0})
	}
	r.measFrom.Store(math.MaxInt64)

	res := result{Label: cfg.label, Mode: "fanout", Addr: cfg.addr, Format: cfg.format, Conns: cfg.conns, Channels: cfg.channels,
		Rate: cfg.rate, RSSDelta: cfg.RSSBefore()}
	if cfg.messages > 0 {
		res.Mode = "burst"
	} else if cfg.publishRate == 0 {
		res.Mode = "idle"
	}
	if cfg.payloads != nil {
		res.PayloadFile, res.Payloads, res.VerifyEvery = filepath.Base(cfg.payloadFile), len(cfg.payloads), cfg.verifyEvery
	}
	res.Opening = r.openAll()
	res.HandshakeBytesRead = r.wire.Load()
	fmt.Fprintf(os.Stderr, "fanload: opened %d failed %d; settle %s\n", res.Opened, res.Failed, cfg.settle)
	if res.Deflate != nil {
		fmt.Fprintf(os.Stderr, "fanload: permessage-deflate accepted on %d of %d: %v\n", res.Deflate.Negotiated, res.Opened, res.Deflate.Extensions)
	}
	time.Sleep(cfg.settle)
	cfg.RSSAfter(&res.RSSDelta, res.Opened)

	if cfg.messages > 0 {
		if res.Opened > 0 {
			r.burst(&res)
		}
	} else if cfg.publishRate == 0 {
		hold := time.Now()
		time.Sleep(cfg.duration)
		res.HoldSeconds = time.Since(hold).Seconds()
	} else if res.Opened > 0 {
		r.publish(&res)
	}
	if cfg.ServerPID > 0 {
		if v, err := loadkit.ProcRSSKB(cfg.ServerPID); err == nil {
			res.RSSEndKB = v
		}
	}
	if v, err := loadkit.ProcRSSKB(os.Getpid()); err == nil {
		res.ClientRSSKB = v
	}
	res.CloseForced = r.closeAll()
	res.ConnErrors = r.connErrs.Snapshot()
	res.ReadErrors = r.readErrs.Snapshot()
	for _, s := range r.subs {
		if s.lostConn {
			res.ClosedByServer++
		}
	}
	if res.Opened > 0 && (cfg.publishRate > 0 || cfg.messages > 0) {
		r.tally(&res)
	}
	loadkit.WriteJSON(res)
}

var chans []chanState

// startPublishers starts -publishers goroutines, each publishing to the channels
// handed to its queue, one request at a time; done ends when the queues are
// closed and drained.
func (r *run) startPublishers(res *result, ps *pubStats) (queues []chan int, done *sync.WaitGroup) {
	cfg := r.cfg
	hc := postClient(cfg, r.ips, ps)
	chans = make([]chanState, cfg.channels)
	pad := bytes.Repeat([]byte("x"), cfg.size)
	queues = make([]chan int, cfg.publishers)
	done = &sync.WaitGroup{}
	for p := range queues {
		queues[p] = make(chan int, 4096)
		done.Add(1)
		go func(p int) {
			defer done.Done()
			for ch := range queues[p] {
				r.publishOne(hc, ps, ch, &chans[ch], pad, p)
			}
		}(p)
	}
	res.Size, res.PublishRate, res.Publishers, res.KeepAlive = cfg.size, cfg.publishRate, cfg.publishers, cfg.keepAlive
	res.WarmupSeconds, res.GraceSeconds, res.ClkTck = cfg.warmup.Seconds(), cfg.grace.Seconds(), cfg.ClkTck
	return queues, done
}

func (r *run) publish(res *result) {
	cfg := r.cfg
	ps := &pubStats{}
	queues, pw := r.startPublishers(res, ps)

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
	win := loadkit.StartWindow(cfg.ServerPID)
	d0, p0, w0 := r.delivers.Load(), ps.ok.Load(), r.wire.Load()
	res.Timeline = loadkit.Timeline(tStart, tEnd, d0, r.delivers.Load)
	d1, p1, w1 := r.delivers.Load(), ps.ok.Load(), r.wire.Load()
	use := win.End()
	window := use.Seconds

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

	r.account(res, ps, use, d1-d0)
	res.wireBytes(w1-w0, d1-d0)
	res.Deliveries = dEnd
	res.PublishedInWindow = p1 - p0
	res.PublishPerSec = float64(p1-p0) / window
	res.DeliveriesInWindow = d1 - d0
	res.DeliveriesInGrace = dEnd - dEndPub
	res.DeliveriesPerSec = float64(d1-d0) / window
}

// burst publishes -messages messages at full speed (or paced at -publish-rate,
// if above 0), round-robin over the channels, and measures from the first
// publish until every subscriber has every accepted message (or -grace after
// the last answer): deliveries/s over that time, latency of every message,
// server CPU per delivery.
func (r *run) burst(res *result) {
	cfg := r.cfg
	ps := &pubStats{}
	queues, pw := r.startPublishers(res, ps)
	open := make([]int64, cfg.channels)
	for _, s := range r.subs {
		if s.conn != nil {
			open[s.ch]++
		}
	}
	expected := func() (n int64) {
		for ch := range chans {
			n += chans[ch].okN.Load() * open[ch]
		}
		return n
	}
	fmt.Fprintf(os.Stderr, "fanload: burst of %d messages over %d channels (paced at %.0f/s; 0 = full speed)\n",
		cfg.messages, cfg.channels, cfg.publishRate)
	start := time.Now()
	deadline := start.Add(cfg.duration)
	r.measFrom.Store(start.UnixNano())
	win := loadkit.StartWindow(cfg.ServerPID)
	d0, w0 := r.delivers.Load(), r.wire.Load()
	for k := 0; k < cfg.messages; k++ {
		if cfg.publishRate > 0 { // paced: message k is due at k/rate (later if the answers are slower)
			time.Sleep(time.Until(start.Add(time.Duration(float64(k) * float64(time.Second) / cfg.publishRate))))
		}
		if time.Now().After(deadline) {
			ps.skipped.Add(int64(cfg.messages - k))
			break
		}
		ch := k % cfg.channels
		queues[ch%cfg.publishers] <- ch
	}
	for _, q := range queues {
		close(q)
	}
	pw.Wait() // every request ends within the request timeout
	published := time.Since(start).Seconds()
	for until := time.Now().Add(cfg.grace); r.delivers.Load()-d0 < expected() && time.Now().Before(until); {
		time.Sleep(time.Millisecond)
	}
	use := win.End()
	d1, w1 := r.delivers.Load(), r.wire.Load()
	r.account(res, ps, use, d1-d0)
	res.wireBytes(w1-w0, d1-d0)
	res.PublishedInWindow = ps.ok.Load()
	res.PublishPerSec = float64(ps.ok.Load()) / published
	res.DeliveriesInWindow = d1 - d0
	res.DeliveriesPerSec = float64(d1-d0) / use.Seconds
}

// wireBytes: the bytes the subscribers read from their sockets in the window.
func (res *result) wireBytes(read, delivered int64) {
	res.WireBytesRead = read
	if delivered > 0 {
		res.WireBytesPer = float64(read) / float64(delivered)
	}
}

// account fills in what every publishing mode reports: the publishes, the
// deliveries, latency, and the CPU of server, client and machine over the window.
func (r *run) account(res *result, ps *pubStats, use loadkit.Usage, delivered int64) {
	cfg := r.cfg
	window := use.Seconds
	tck := float64(cfg.ClkTck)
	res.WindowSeconds = window
	res.PublishedOK = ps.ok.Load()
	res.PublishFailed, res.PublishSkipped = ps.failed.Load(), ps.skipped.Load()
	res.PublishErrors = ps.errs.Snapshot()
	res.PublishSeqMismatch, res.PublishDials = ps.seqMismatch.Load(), ps.dials.Load()
	res.PublishedBytesOK = ps.bytesOK.Load()
	if res.PublishedOK > 0 {
		res.PayloadBytesMean = float64(res.PublishedBytesOK) / float64(res.PublishedOK)
	}
	rtt := summarize(ps.rtt.Merged())
	res.PublishRTTUS = &rtt
	res.Deliveries = r.delivers.Load()
	lat := summarize(r.lat.Merged())
	res.LatencyUS = &lat
	if r.cfg.rxStamps {
		arr := summarize(r.arrival.Merged())
		res.ArrivalUS = &arr
	}
	res.ClientCPUSeconds = use.ClientSeconds
	res.ClientCPUCores = res.ClientCPUSeconds / window
	res.MachineBusy = loadkit.UserHZSeconds(use.Machine.Busy)
	res.MachineIRQ = loadkit.UserHZSeconds(use.Machine.IRQ)
	res.MachineSteal = loadkit.UserHZSeconds(use.Machine.Steal)
	res.OtherProcs = float64(use.OthersTicks) / tck
	if delivered > 0 {
		res.ClientCPUUSPer = res.ClientCPUSeconds * 1e6 / float64(delivered)
	}
	res.Residual = res.MachineBusy - res.ClientCPUSeconds
	if use.ServerOK {
		res.ServerCPUSeconds = float64(use.ServerTicks) / tck
		res.ServerSysSeconds = float64(use.ServerSys) / tck
		res.ServerCPUCores = res.ServerCPUSeconds / window
		res.Residual -= res.ServerCPUSeconds
		if delivered > 0 {
			res.ServerCPUUSPer = res.ServerCPUSeconds * 1e6 / float64(delivered)
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
		res.Verified += s.verified
		res.PayloadMismatch += s.mismatch
		if lost > 0 {
			res.SubsWithLoss++
		}
	}
}

func fail(msg string) { loadkit.Fail("fanload", msg) }
