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
// -deflate offers permessage-deflate (gorilla's EnableCompression: the offer
// "permessage-deflate; server_no_context_takeover; client_no_context_takeover")
// and reports under "deflate" how many connections the server accepted it for and
// its exact Sec-WebSocket-Extensions answers. Echo messages are then sent
// compressed where it was accepted (gorilla's default).
//
// Output: one JSON object on stdout. Progress goes to stderr.
// Everything is bounded: dials time out, the load window is fixed, reads and
// writes carry deadlines.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"

	"throng-bench/clients/internal/loadkit"
)

type config struct {
	loadkit.Common
	mode     string
	url      string
	conns    int
	rate     float64
	duration time.Duration
	settle   time.Duration
	warmup   time.Duration
	size     int
	readBuf  int
	writeBuf int
	deflate  bool
}

// ---------- connection opening ----------

// opening is what both modes report first: the connections and their opening.
type opening struct {
	Mode  string  `json:"mode"`
	URL   string  `json:"url"`
	Conns int     `json:"conns_requested"`
	Rate  float64 `json:"rate"`
	loadkit.Opening
}

// openAll dials cfg.conns connections paced at cfg.rate per second, spread
// over the source addresses, and calls onOpen(i, conn) in the dialing
// goroutine for each success. It returns when every dial has finished (each
// bounded by dialTimeout).
func openAll(cfg *config, ips []net.IP, onOpen func(int, *websocket.Conn)) opening {
	o := loadkit.Opener{Prog: "wsload", Conns: cfg.conns, Rate: cfg.rate, IPs: ips, Timeout: cfg.DialTimeout,
		ReadBuf: cfg.readBuf, WriteBuf: cfg.writeBuf, URL: func(int) string { return cfg.url },
		TLS: cfg.TLSConfig("wsload"), Deflate: cfg.deflate}
	return opening{Mode: cfg.mode, URL: cfg.url, Conns: cfg.conns, Rate: cfg.rate, Opening: o.Open(onOpen)}
}

// ---------- idle mode ----------

type idleResult struct {
	opening
	HoldSeconds    float64 `json:"hold_seconds"`
	PingsSeen      int64   `json:"pings_seen"`
	MessagesSeen   int64   `json:"messages_seen"`
	ClosedByPeer   int64   `json:"closed_by_peer_during_hold"`
	StillOpenAtEnd int64   `json:"still_open_at_end"`
	loadkit.RSSDelta
	ClientRSSKB int64 `json:"client_rss_kb"`
}

func runIdle(cfg *config, ips []net.IP) any {
	res := idleResult{RSSDelta: cfg.RSSBefore()}
	var pings, msgs, closedByPeer, open atomic.Int64
	var holding atomic.Bool
	conns := make([]*websocket.Conn, cfg.conns)
	var readers sync.WaitGroup
	res.opening = openAll(cfg, ips, func(i int, c *websocket.Conn) {
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
	fmt.Fprintf(os.Stderr, "wsload: idle: opened %d failed %d in %.1fs; holding %s\n", res.Opened, res.Failed, res.OpenSeconds, cfg.duration)

	holding.Store(true)
	holdStart := time.Now()
	if cfg.ServerPID > 0 {
		time.Sleep(cfg.settle)
		cfg.RSSAfter(&res.RSSDelta, res.Opened)
	}
	if rest := cfg.duration - time.Since(holdStart); rest > 0 {
		time.Sleep(rest)
	}
	holding.Store(false)
	res.HoldSeconds = time.Since(holdStart).Seconds()
	res.PingsSeen, res.MessagesSeen, res.ClosedByPeer = pings.Load(), msgs.Load(), closedByPeer.Load()
	res.StillOpenAtEnd = open.Load()
	if v, err := loadkit.ProcRSSKB(os.Getpid()); err == nil {
		res.ClientRSSKB = v
	}

	// Close politely: close frame, give the server a moment to answer, then
	// force-close whatever is left.
	var opened []*websocket.Conn
	for _, c := range conns {
		if c != nil {
			opened = append(opened, c)
		}
	}
	loadkit.CloseAll(opened, &readers)
	return res
}

// ---------- echo mode ----------

type echoResult struct {
	opening
	Size                 int             `json:"size"`
	WarmupSeconds        float64         `json:"warmup_seconds"`
	WindowSeconds        float64         `json:"window_seconds"`
	Messages             int64           `json:"messages"`
	MsgsPerSec           float64         `json:"msgs_per_sec"`
	LatencyUS            loadkit.Latency `json:"latency_us"`
	Errors               int64           `json:"errors"`
	Mismatches           int64           `json:"mismatches"`
	ErrorSamples         map[string]int  `json:"error_samples,omitempty"`
	ServerPID            int             `json:"server_pid,omitempty"`
	ClkTck               int             `json:"clk_tck,omitempty"`
	ServerCPUTicks       int64           `json:"server_cpu_ticks,omitempty"`
	ServerCPUSeconds     float64         `json:"server_cpu_seconds,omitempty"`
	ServerCPUUSPer       float64         `json:"server_cpu_us_per_msg,omitempty"`
	ServerRSSKB          int64           `json:"server_rss_kb_end,omitempty"`
	PerSecond            []int64         `json:"msgs_per_second_timeline"`
	StealSeconds         float64         `json:"machine_steal_seconds"`
	IdleSeconds          float64         `json:"machine_idle_seconds"`
	IRQSeconds           float64         `json:"machine_irq_softirq_seconds"`
	OtherCPUSeconds      float64         `json:"machine_other_cpu_seconds"`
	OtherProcsCPUSeconds float64         `json:"machine_other_procs_cpu_seconds"`
	ResidualCPUSeconds   float64         `json:"machine_residual_cpu_seconds,omitempty"`
	ClientCPUSeconds     float64         `json:"client_cpu_seconds"`
	ClientCPUUSPer       float64         `json:"client_cpu_us_per_msg"`
}

func runEcho(cfg *config, ips []net.IP) any {
	res := echoResult{Size: cfg.size, ServerPID: cfg.ServerPID, ClkTck: cfg.ClkTck}
	payload := bytes.Repeat([]byte("x"), cfg.size)
	for i := range payload {
		payload[i] = 'a' + byte(i%26)
	}
	var mu sync.Mutex
	var conns []*websocket.Conn
	res.opening = openAll(cfg, ips, func(i int, c *websocket.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	})
	fmt.Fprintf(os.Stderr, "wsload: echo: opened %d failed %d in %.1fs; warmup %s, window %s\n", res.Opened, res.Failed, res.OpenSeconds, cfg.warmup, cfg.duration)
	if len(conns) == 0 {
		return res
	}

	begin := time.Now().Add(50 * time.Millisecond)
	tStart := begin.Add(cfg.warmup)
	tEnd := tStart.Add(cfg.duration)
	hardDeadline := tEnd.Add(10 * time.Second)

	var total loadkit.Hist
	var totalMsgs, nErr, nMismatch, live atomic.Int64
	var runErrs loadkit.ErrCounter
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Add(1)
		go func(c *websocket.Conn) {
			defer wg.Done()
			defer c.Close()
			var h loadkit.Hist
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
					runErrs.Add(err.Error())
					break
				}
				mt, r, err := c.NextReader()
				if err != nil {
					nErr.Add(1)
					runErrs.Add(err.Error())
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
					h.Add(int64(t1.Sub(t0)))
				}
			}
			mu.Lock()
			total.Merge(&h)
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
	win := loadkit.StartWindow(cfg.ServerPID)
	// per-second timeline of completed echoes, to spot stalls or drift
	res.PerSecond = loadkit.Timeline(tStart, tEnd, 0, live.Load)
	use := win.End()
	res.StealSeconds = loadkit.UserHZSeconds(use.Machine.Steal)
	res.IdleSeconds = loadkit.UserHZSeconds(use.Machine.Idle)
	res.IRQSeconds = loadkit.UserHZSeconds(use.Machine.IRQ)
	// CPU of other user-space processes during the window: a gauge of
	// disturbance by other sessions on a shared machine.
	res.OtherProcsCPUSeconds = float64(use.OthersTicks) / float64(cfg.ClkTck)
	res.OtherCPUSeconds = res.OtherProcsCPUSeconds
	if cfg.ServerPID > 0 {
		if v, err := loadkit.ProcRSSKB(cfg.ServerPID); err == nil {
			res.ServerRSSKB = v
		}
	}
	wg.Wait()

	res.WarmupSeconds = cfg.warmup.Seconds()
	res.WindowSeconds = use.Seconds
	res.Messages = totalMsgs.Load()
	res.MsgsPerSec = float64(res.Messages) / cfg.duration.Seconds()
	res.LatencyUS = loadkit.Summarize(&total)
	res.Errors, res.Mismatches = nErr.Load(), nMismatch.Load()
	res.ErrorSamples = runErrs.Snapshot()
	res.ClientCPUSeconds = use.ClientSeconds
	if res.Messages > 0 {
		res.ClientCPUUSPer = res.ClientCPUSeconds * 1e6 / float64(res.Messages)
	}
	if use.ServerOK {
		res.ServerCPUTicks = use.ServerTicks
		res.ServerCPUSeconds = float64(res.ServerCPUTicks) / float64(cfg.ClkTck)
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
	flag.IntVar(&cfg.readBuf, "read-buf", 0, "gorilla client read buffer size (0 = default 4096)")
	flag.IntVar(&cfg.writeBuf, "write-buf", 0, "gorilla client write buffer size (0 = default 4096)")
	flag.BoolVar(&cfg.deflate, "deflate", false, "offer permessage-deflate (server_no_context_takeover; client_no_context_takeover) and report what the server answered")
	cfg.Register()
	flag.Parse()

	if cfg.conns <= 0 || cfg.conns > 100000 {
		loadkit.Fail("wsload", "-conns must be 1..100000")
	}
	if cfg.duration <= 0 || cfg.duration > time.Hour {
		loadkit.Fail("wsload", "-duration must be >0 and <=1h")
	}
	if cfg.mode == "idle" && cfg.ServerPID > 0 && cfg.duration < cfg.settle+time.Duration(cfg.RSSSamples)*200*time.Millisecond {
		cfg.duration = cfg.settle + time.Duration(cfg.RSSSamples)*200*time.Millisecond
	}
	ips := cfg.Check("wsload")
	var res any
	switch cfg.mode {
	case "idle":
		res = runIdle(cfg, ips)
	case "echo":
		res = runEcho(cfg, ips)
	default:
		loadkit.Fail("wsload", "-mode must be idle or echo")
	}
	loadkit.WriteJSON(res)
}
