// wsload: WebSocket load client for throng's engine benchmark.
//
// Modes:
//
//	idle: open -conns connections (paced at -rate/s), hold them for -duration,
//	      answer pings, report opened/failed/pings seen. With -server-pid it
//	      samples the server's VmRSS before the first connection and after
//	      -settle, and reports the RSS delta per connection.
//	echo: open -conns connections (all open before the load starts), then each
//	      connection sends a -size byte text message, waits for the echo and
//	      sends the next (one message in flight per connection) for -duration
//	      after a -warmup. Reports messages, msgs/s, latency percentiles; with
//	      -server-pid also the server's CPU time in the measured window.
//
// Output: one JSON object on stdout. Progress goes to stderr.
// Everything is bounded: dials time out, the load window is fixed, reads and
// writes carry deadlines.
package main

import (
	"bytes"
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
	"runtime"
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
	mode        string
	url         string
	conns       int
	rate        float64
	duration    time.Duration
	settle      time.Duration
	warmup      time.Duration
	size        int
	sourceIPs   string
	serverPID   int
	clkTck      int
	dialTimeout time.Duration
	readBuf     int
	writeBuf    int
	rssSamples  int
}

// ---------- /proc helpers ----------

// procCPUTicks returns utime+stime (clock ticks) of pid from /proc/PID/stat.
func procCPUTicks(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("bad stat")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime is field 14, stime field 15.
	if len(f) < 13 {
		return 0, errors.New("short stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("bad stat numbers")
	}
	return ut + st, nil
}

// procRSSKB returns VmRSS in KiB of pid.
func procRSSKB(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			if len(f) >= 2 {
				return strconv.ParseInt(f[1], 10, 64)
			}
		}
	}
	return 0, errors.New("no VmRSS")
}

// sampleRSS takes n samples spaced by gap and returns them plus the median.
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
		return out, -1
	}
	s := append([]int64(nil), out...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return out, s[len(s)/2]
}

// machineStat returns machine-wide idle(+iowait), irq+softirq and steal time
// (all CPUs) from the first line of /proc/stat.
func machineStat() (idle, irq, steal time.Duration) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, 0, 0
	}
	n := func(i int) time.Duration {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		return time.Duration(v) * 10 * time.Millisecond // USER_HZ is 100 on Linux
	}
	return n(4) + n(5), n(6) + n(7), n(8)
}

// othersCPU returns, per pid, utime+stime+cutime+cstime (ticks) of every
// user-space process except the excluded pids. Children that exit and are
// reaped show up in their parent's cutime/cstime. Kernel threads are skipped
// (ksoftirqd etc. do the loopback work of the benchmark itself).
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
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		st := string(b)
		i := strings.LastIndexByte(st, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(st[i+1:])
		if len(f) < 15 {
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
			d += v // started during the window
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

// ---------- source addresses ----------

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

// ---------- latency histogram (log-linear, ~1.6% relative error) ----------

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
	m := uint64(b - e*64)
	return m << uint(e)
}

func (h *hist) add(v time.Duration) {
	if v < 0 {
		v = 0
	}
	h[bucketOf(uint64(v))]++
}

func (h *hist) merge(o *hist) {
	for i := range h {
		h[i] += o[i]
	}
}

// quantile returns the value (ns) at quantile q.
func (h *hist) quantile(q float64) uint64 {
	var total uint64
	for _, c := range h {
		total += c
	}
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

// ---------- connection opening ----------

type errCounter struct {
	mu sync.Mutex
	m  map[string]int
}

func (e *errCounter) add(err error) {
	s := err.Error()
	// strip per-connection address detail so identical causes group together
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
	out := map[string]int{}
	for k, v := range e.m {
		out[k] = v
	}
	return out
}

// openAll dials cfg.conns connections paced at cfg.rate per second and calls
// onOpen(i, conn) in the dialing goroutine for each success. It returns when
// every dial has finished (each bounded by dialTimeout).
func openAll(cfg *config, ips []net.IP, dialErrs *errCounter, onOpen func(int, *websocket.Conn)) (opened, failed int64, took time.Duration) {
	dialers := make([]*websocket.Dialer, 0, len(ips)+1)
	mk := func(local net.Addr) *websocket.Dialer {
		nd := &net.Dialer{Timeout: cfg.dialTimeout, LocalAddr: local}
		return &websocket.Dialer{
			NetDialContext:   nd.DialContext,
			HandshakeTimeout: cfg.dialTimeout,
			ReadBufferSize:   cfg.readBuf,
			WriteBufferSize:  cfg.writeBuf,
		}
	}
	if len(ips) == 0 {
		dialers = append(dialers, mk(nil))
	}
	for _, ip := range ips {
		dialers = append(dialers, mk(&net.TCPAddr{IP: ip}))
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
			d := dialers[i%len(dialers)]
			c, resp, err := d.Dial(cfg.url, http.Header{})
			if err != nil {
				if resp != nil {
					err = fmt.Errorf("%w (HTTP %d)", err, resp.StatusCode)
				}
				dialErrs.add(err)
				nFail.Add(1)
				return
			}
			nOK.Add(1)
			onOpen(i, c)
		}(i)
		if (i+1)%5000 == 0 {
			fmt.Fprintf(os.Stderr, "wsload: dialed %d/%d\n", i+1, cfg.conns)
		}
	}
	wg.Wait()
	return nOK.Load(), nFail.Load(), time.Since(start)
}

// ---------- idle mode ----------

type idleResult struct {
	Mode             string         `json:"mode"`
	URL              string         `json:"url"`
	Conns            int            `json:"conns_requested"`
	Rate             float64        `json:"rate"`
	SourceIPs        int            `json:"source_ips"`
	Opened           int64          `json:"opened"`
	Failed           int64          `json:"failed"`
	DialErrors       map[string]int `json:"dial_errors,omitempty"`
	OpenSeconds      float64        `json:"open_seconds"`
	HoldSeconds      float64        `json:"hold_seconds"`
	PingsSeen        int64          `json:"pings_seen"`
	MessagesSeen     int64          `json:"messages_seen"`
	ClosedByPeer     int64          `json:"closed_by_peer_during_hold"`
	StillOpenAtEnd   int64          `json:"still_open_at_end"`
	ServerPID        int            `json:"server_pid,omitempty"`
	RSSBeforeSamples []int64        `json:"server_rss_before_kb_samples,omitempty"`
	RSSAfterSamples  []int64        `json:"server_rss_after_kb_samples,omitempty"`
	RSSBeforeKB      int64          `json:"server_rss_before_kb,omitempty"`
	RSSAfterKB       int64          `json:"server_rss_after_kb,omitempty"`
	RSSBytesPerConn  float64        `json:"server_rss_bytes_per_conn,omitempty"`
	ClientRSSKB      int64          `json:"client_rss_kb"`
}

func runIdle(cfg *config, ips []net.IP) any {
	res := idleResult{Mode: "idle", URL: cfg.url, Conns: cfg.conns, Rate: cfg.rate, SourceIPs: len(ips), ServerPID: cfg.serverPID}
	if cfg.serverPID > 0 {
		res.RSSBeforeSamples, res.RSSBeforeKB = sampleRSS(cfg.serverPID, cfg.rssSamples, 200*time.Millisecond)
	}
	var pings, msgs, closedByPeer, open atomic.Int64
	var holding atomic.Bool
	conns := make([]*websocket.Conn, cfg.conns)
	var readers sync.WaitGroup
	var dialErrs errCounter
	opened, failed, took := openAll(cfg, ips, &dialErrs, func(i int, c *websocket.Conn) {
		conns[i] = c
		open.Add(1)
		c.SetPingHandler(func(data string) error {
			pings.Add(1)
			err := c.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(5*time.Second))
			if err != nil && !errors.Is(err, websocket.ErrCloseSent) {
				return err
			}
			return nil
		})
		readers.Add(1)
		go func() {
			defer readers.Done()
			defer open.Add(-1)
			defer c.Close()
			for {
				_, r, err := c.NextReader()
				if err != nil {
					if holding.Load() {
						closedByPeer.Add(1)
					}
					return
				}
				msgs.Add(1)
				io.Copy(io.Discard, r)
			}
		}()
	})
	res.Opened, res.Failed, res.OpenSeconds = opened, failed, took.Seconds()
	res.DialErrors = dialErrs.snapshot()
	fmt.Fprintf(os.Stderr, "wsload: idle: opened %d failed %d in %.1fs; holding %s\n", opened, failed, took.Seconds(), cfg.duration)

	holding.Store(true)
	holdStart := time.Now()
	if cfg.serverPID > 0 {
		time.Sleep(cfg.settle)
		res.RSSAfterSamples, res.RSSAfterKB = sampleRSS(cfg.serverPID, cfg.rssSamples, 200*time.Millisecond)
		if res.Opened > 0 && res.RSSBeforeKB > 0 && res.RSSAfterKB > 0 {
			res.RSSBytesPerConn = float64(res.RSSAfterKB-res.RSSBeforeKB) * 1024 / float64(res.Opened)
		}
	}
	if rest := cfg.duration - time.Since(holdStart); rest > 0 {
		time.Sleep(rest)
	}
	holding.Store(false)
	res.HoldSeconds = time.Since(holdStart).Seconds()
	res.PingsSeen, res.MessagesSeen, res.ClosedByPeer = pings.Load(), msgs.Load(), closedByPeer.Load()
	res.StillOpenAtEnd = open.Load()
	if v, err := procRSSKB(os.Getpid()); err == nil {
		res.ClientRSSKB = v
	}

	// Close politely: close frame, give the server a moment to answer, then
	// force-close whatever is left.
	closeMsg := websocket.FormatCloseMessage(websocket.CloseNormalClosure, "")
	var cw sync.WaitGroup
	for _, c := range conns {
		if c == nil {
			continue
		}
		cw.Add(1)
		go func(c *websocket.Conn) {
			defer cw.Done()
			c.WriteControl(websocket.CloseMessage, closeMsg, time.Now().Add(time.Second))
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
		}(c)
	}
	cw.Wait()
	done := make(chan struct{})
	go func() { readers.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}
	return res
}

// ---------- echo mode ----------

type latency struct {
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Max  float64 `json:"max"`
}

type echoResult struct {
	Mode                 string         `json:"mode"`
	URL                  string         `json:"url"`
	Conns                int            `json:"conns_requested"`
	Rate                 float64        `json:"rate"`
	SourceIPs            int            `json:"source_ips"`
	Opened               int64          `json:"opened"`
	Failed               int64          `json:"failed"`
	DialErrors           map[string]int `json:"dial_errors,omitempty"`
	OpenSeconds          float64        `json:"open_seconds"`
	Size                 int            `json:"size"`
	WarmupSeconds        float64        `json:"warmup_seconds"`
	WindowSeconds        float64        `json:"window_seconds"`
	Messages             int64          `json:"messages"`
	MsgsPerSec           float64        `json:"msgs_per_sec"`
	LatencyUS            latency        `json:"latency_us"`
	Errors               int64          `json:"errors"`
	Mismatches           int64          `json:"mismatches"`
	ErrorSamples         map[string]int `json:"error_samples,omitempty"`
	ServerPID            int            `json:"server_pid,omitempty"`
	ClkTck               int            `json:"clk_tck,omitempty"`
	ServerCPUTicks       int64          `json:"server_cpu_ticks,omitempty"`
	ServerCPUSeconds     float64        `json:"server_cpu_seconds,omitempty"`
	ServerCPUUSPer       float64        `json:"server_cpu_us_per_msg,omitempty"`
	ServerRSSKB          int64          `json:"server_rss_kb_end,omitempty"`
	PerSecond            []int64        `json:"msgs_per_second_timeline"`
	StealSeconds         float64        `json:"machine_steal_seconds"`
	IdleSeconds          float64        `json:"machine_idle_seconds"`
	IRQSeconds           float64        `json:"machine_irq_softirq_seconds"`
	OtherCPUSeconds      float64        `json:"machine_other_cpu_seconds"`
	OtherProcsCPUSeconds float64        `json:"machine_other_procs_cpu_seconds"`
	ResidualCPUSeconds   float64        `json:"machine_residual_cpu_seconds,omitempty"`
	ClientCPUSeconds     float64        `json:"client_cpu_seconds"`
	ClientCPUUSPer       float64        `json:"client_cpu_us_per_msg"`
}

func runEcho(cfg *config, ips []net.IP) any {
	res := echoResult{Mode: "echo", URL: cfg.url, Conns: cfg.conns, Rate: cfg.rate, SourceIPs: len(ips), Size: cfg.size,
		ServerPID: cfg.serverPID, ClkTck: cfg.clkTck}
	payload := bytes.Repeat([]byte("x"), cfg.size)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	var mu sync.Mutex
	var conns []*websocket.Conn
	var dialErrs errCounter
	opened, failed, took := openAll(cfg, ips, &dialErrs, func(i int, c *websocket.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	})
	res.Opened, res.Failed, res.OpenSeconds = opened, failed, took.Seconds()
	res.DialErrors = dialErrs.snapshot()
	fmt.Fprintf(os.Stderr, "wsload: echo: opened %d failed %d in %.1fs; warmup %s, window %s\n", opened, failed, took.Seconds(), cfg.warmup, cfg.duration)
	if len(conns) == 0 {
		return res
	}

	begin := time.Now().Add(50 * time.Millisecond)
	tStart := begin.Add(cfg.warmup)
	tEnd := tStart.Add(cfg.duration)
	hardDeadline := tEnd.Add(10 * time.Second)

	var total hist
	var totalMsgs, nErr, nMismatch, live atomic.Int64
	var runErrs errCounter
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func(c *websocket.Conn) {
			defer wg.Done()
			defer c.Close()
			var h hist
			var n int64
			buf := make([]byte, cfg.size+1)
			c.SetReadDeadline(hardDeadline)
			c.SetWriteDeadline(hardDeadline)
			time.Sleep(time.Until(begin))
			for {
				t0 := time.Now()
				if !t0.Before(tEnd) {
					break
				}
				if err := c.WriteMessage(websocket.TextMessage, payload); err != nil {
					nErr.Add(1)
					runErrs.add(err)
					break
				}
				mt, r, err := c.NextReader()
				if err != nil {
					nErr.Add(1)
					runErrs.add(err)
					break
				}
				k, err := io.ReadFull(r, buf)
				if mt != websocket.TextMessage || k != cfg.size || !bytes.Equal(buf[:k], payload) ||
					(err != io.ErrUnexpectedEOF && err != io.EOF) {
					nMismatch.Add(1)
					io.Copy(io.Discard, r)
				}
				t1 := time.Now()
				if !t1.Before(tStart) && t1.Before(tEnd) {
					n++
					live.Add(1)
					h.add(t1.Sub(t0))
				}
			}
			mu.Lock()
			total.merge(&h)
			mu.Unlock()
			totalMsgs.Add(n)
			// polite close, bounded
			c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
			c.SetReadDeadline(time.Now().Add(time.Second))
			for {
				if _, _, err := c.NextReader(); err != nil {
					break
				}
			}
		}(c)
	}

	time.Sleep(time.Until(tStart))
	var srvT0, srvT1 int64
	var srvErr error
	if cfg.serverPID > 0 {
		srvT0, srvErr = procCPUTicks(cfg.serverPID)
	}
	cli0 := selfCPU()
	idle0, irq0, steal0 := machineStat()
	others0 := othersCPU(os.Getpid(), cfg.serverPID)
	wallStart := time.Now()
	// per-second timeline of completed echoes, to spot stalls or drift
	var last int64
	for sec := 1; ; sec++ {
		next := tStart.Add(time.Duration(sec) * time.Second)
		if next.After(tEnd) {
			break
		}
		time.Sleep(time.Until(next))
		v := live.Load()
		res.PerSecond = append(res.PerSecond, v-last)
		last = v
	}
	time.Sleep(time.Until(tEnd))
	others1 := othersCPU(os.Getpid(), cfg.serverPID)
	idle1, irq1, steal1 := machineStat()
	res.StealSeconds = (steal1 - steal0).Seconds()
	res.IdleSeconds = (idle1 - idle0).Seconds()
	res.IRQSeconds = (irq1 - irq0).Seconds()
	// CPU of other user-space processes during the window: a gauge of
	// disturbance by other sessions on a shared machine.
	res.OtherProcsCPUSeconds = float64(othersDelta(others0, others1)) / float64(cfg.clkTck)
	res.OtherCPUSeconds = res.OtherProcsCPUSeconds
	if cfg.serverPID > 0 && srvErr == nil {
		srvT1, srvErr = procCPUTicks(cfg.serverPID)
	}
	cli1 := selfCPU()
	window := time.Since(wallStart)
	if cfg.serverPID > 0 {
		if v, err := procRSSKB(cfg.serverPID); err == nil {
			res.ServerRSSKB = v
		}
	}
	wg.Wait()

	res.WarmupSeconds = cfg.warmup.Seconds()
	res.WindowSeconds = window.Seconds()
	res.Messages = totalMsgs.Load()
	res.MsgsPerSec = float64(res.Messages) / cfg.duration.Seconds()
	us := func(ns uint64) float64 { return float64(ns) / 1000 }
	res.LatencyUS = latency{P50: us(total.quantile(0.5)), P90: us(total.quantile(0.9)), P99: us(total.quantile(0.99)),
		P999: us(total.quantile(0.999)), Max: us(total.max())}
	res.Errors, res.Mismatches = nErr.Load(), nMismatch.Load()
	res.ErrorSamples = runErrs.snapshot()
	res.ClientCPUSeconds = (cli1 - cli0).Seconds()
	if res.Messages > 0 {
		res.ClientCPUUSPer = res.ClientCPUSeconds * 1e6 / float64(res.Messages)
	}
	if cfg.serverPID > 0 && srvErr == nil {
		res.ServerCPUTicks = srvT1 - srvT0
		res.ServerCPUSeconds = float64(res.ServerCPUTicks) / float64(cfg.clkTck)
		if res.Messages > 0 {
			res.ServerCPUUSPer = res.ServerCPUSeconds * 1e6 / float64(res.Messages)
		}
		// Residual machine CPU not charged to server or client (other
		// processes plus kernel threads/softirq): informational.
		res.ResidualCPUSeconds = float64(runtime.NumCPU())*res.WindowSeconds - res.IdleSeconds - res.StealSeconds -
			res.ServerCPUSeconds - res.ClientCPUSeconds
		// Reaped children are charged to their parent whole (cutime), so the
		// per-process sum can overshoot; the machine residual bounds it.
		if res.ResidualCPUSeconds < res.OtherCPUSeconds {
			res.OtherCPUSeconds = math.Max(res.ResidualCPUSeconds, 0)
		}
	}
	return res
}

func main() {
	cfg := &config{}
	flag.StringVar(&cfg.mode, "mode", "echo", "idle | echo")
	flag.StringVar(&cfg.url, "url", "ws://127.0.0.1:8080/echo", "WebSocket URL")
	flag.IntVar(&cfg.conns, "conns", 100, "number of connections")
	flag.Float64Var(&cfg.rate, "rate", 2000, "connection opening rate per second (0 = unpaced)")
	flag.DurationVar(&cfg.duration, "duration", 10*time.Second, "idle: hold time after all are open; echo: measured load window")
	flag.DurationVar(&cfg.settle, "settle", 3*time.Second, "idle: wait after all are open before sampling server RSS")
	flag.DurationVar(&cfg.warmup, "warmup", time.Second, "echo: load before the measured window")
	flag.IntVar(&cfg.size, "size", 32, "echo: message size in bytes (text)")
	flag.StringVar(&cfg.sourceIPs, "source-ips", "", "source address list/range to bind before connect, e.g. 127.0.0.2-127.0.0.254")
	flag.IntVar(&cfg.serverPID, "server-pid", 0, "server pid: sample its RSS (idle) and CPU time (echo) from /proc")
	flag.IntVar(&cfg.clkTck, "clk-tck", 100, "clock ticks per second for /proc/PID/stat (getconf CLK_TCK)")
	flag.DurationVar(&cfg.dialTimeout, "dial-timeout", 10*time.Second, "TCP connect + handshake timeout")
	flag.IntVar(&cfg.readBuf, "read-buf", 0, "gorilla client read buffer size (0 = default 4096)")
	flag.IntVar(&cfg.writeBuf, "write-buf", 0, "gorilla client write buffer size (0 = default 4096)")
	flag.IntVar(&cfg.rssSamples, "rss-samples", 5, "idle: server RSS samples (200ms apart) before and after; the median is used")
	flag.Parse()

	if cfg.conns <= 0 || cfg.conns > 100000 {
		fmt.Fprintln(os.Stderr, "wsload: -conns must be 1..100000")
		os.Exit(2)
	}
	if cfg.duration <= 0 || cfg.duration > time.Hour {
		fmt.Fprintln(os.Stderr, "wsload: -duration must be >0 and <=1h")
		os.Exit(2)
	}
	if cfg.mode == "idle" && cfg.serverPID > 0 && cfg.duration < cfg.settle+time.Duration(cfg.rssSamples)*200*time.Millisecond {
		cfg.duration = cfg.settle + time.Duration(cfg.rssSamples)*200*time.Millisecond
	}
	if cfg.rssSamples < 1 {
		cfg.rssSamples = 1
	}
	ips, err := parseSourceIPs(cfg.sourceIPs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "wsload:", err)
		os.Exit(2)
	}
	var res any
	switch cfg.mode {
	case "idle":
		res = runIdle(cfg, ips)
	case "echo":
		res = runEcho(cfg, ips)
	default:
		fmt.Fprintln(os.Stderr, "wsload: -mode must be idle or echo")
		os.Exit(2)
	}
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(res); err != nil {
		os.Exit(1)
	}
}
