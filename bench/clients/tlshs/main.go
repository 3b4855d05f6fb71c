// tlshs: TLS handshakes per second, full or resumed, against any HTTPS server.
//
// -conns connections are made by -concurrency workers, each: TCP connect, TLS
// handshake, "GET -path" with Connection: close, read the answer to its end,
// close. With -resume each worker keeps a session cache, so after its first
// connection every handshake offers a ticket (TLS 1.3 tickets arrive with the
// answer; TLS 1.2 ones in the handshake); without it every handshake is full.
// With -server-pid the server's CPU time (utime+stime, its children too) over
// the run gives handshakes per server CPU-second: per core.
//
// Output: one JSON object on stdout. Bounded: -conns and -timeout.
package main

import (
	"bufio"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"throng-bench/clients/internal/loadkit"
)

type result struct {
	Addr             string         `json:"addr"`
	Version          string         `json:"tls_version"`
	Resume           bool           `json:"resume"`
	Conns            int            `json:"conns_requested"`
	Concurrency      int            `json:"concurrency"`
	Done             int64          `json:"handshakes"`
	Resumed          int64          `json:"resumed"`
	Failed           int64          `json:"failed"`
	Errors           map[string]int `json:"errors,omitempty"`
	Seconds          float64        `json:"seconds"`
	PerSecond        float64        `json:"handshakes_per_second"`
	ServerCPUSeconds float64        `json:"server_cpu_seconds,omitempty"`
	PerServerCPUSec  float64        `json:"handshakes_per_server_cpu_second,omitempty"`
	ServerCPUUSPerHS float64        `json:"server_cpu_us_per_handshake,omitempty"`
}

func main() {
	var c loadkit.Common
	c.Register()
	addr := flag.String("addr", "127.0.0.1:8443", "server HOST:PORT")
	name := flag.String("server-name", "localhost", "SNI and the name the certificate must carry")
	path := flag.String("path", "/healthz", "what each connection GETs")
	conns := flag.Int("conns", 2000, "connections (handshakes) in all")
	concurrency := flag.Int("concurrency", 8, "connections at once")
	resume := flag.Bool("resume", false, "offer session tickets (a per-worker session cache)")
	version := flag.String("tls", "1.3", "TLS version: 1.2 or 1.3")
	timeout := flag.Duration("timeout", 10*time.Second, "bounds one connection")
	flag.Parse()
	ips := c.Check("tlshs")
	if *conns < 1 || *conns > 1_000_000 || *concurrency < 1 || *concurrency > 1000 {
		loadkit.Fail("tlshs", "-conns must be 1..1000000 and -concurrency 1..1000")
	}
	base := c.TLSConfig("tlshs")
	if base == nil {
		base = &tls.Config{}
	}
	base.ServerName = *name
	base.NextProtos = []string{"http/1.1"}
	switch *version {
	case "1.2":
		base.MinVersion, base.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	case "1.3":
		base.MinVersion, base.MaxVersion = tls.VersionTLS13, tls.VersionTLS13
	default:
		loadkit.Fail("tlshs", "-tls must be 1.2 or 1.3")
	}
	request := []byte("GET " + *path + " HTTP/1.1\r\nHost: " + *name + "\r\nConnection: close\r\n\r\n")

	var next, done, resumed, failed atomic.Int64
	var errs loadkit.ErrCounter
	one := func(cfg *tls.Config, local net.Addr) error {
		d := net.Dialer{Timeout: *timeout, LocalAddr: local}
		raw, err := d.Dial("tcp", *addr)
		if err != nil {
			return err
		}
		defer raw.Close()
		_ = raw.SetDeadline(time.Now().Add(*timeout))
		conn := tls.Client(raw, cfg)
		if err := conn.Handshake(); err != nil {
			return err
		}
		if _, err := conn.Write(request); err != nil {
			return err
		}
		status, err := bufio.NewReader(conn).ReadString('\n')
		if err != nil {
			return err
		}
		if len(status) < 12 || status[9:12] != "200" {
			return fmt.Errorf("answer %q", status)
		}
		if _, err := io.Copy(io.Discard, conn); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if conn.ConnectionState().DidResume {
			resumed.Add(1)
		}
		return nil
	}
	win := loadkit.StartWindow(c.ServerPID)
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < *concurrency; w++ {
		cfg := base.Clone()
		if *resume {
			cfg.ClientSessionCache = tls.NewLRUClientSessionCache(4)
		}
		var local net.Addr
		if len(ips) > 0 {
			local = &net.TCPAddr{IP: ips[w%len(ips)]}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(*conns) {
				if err := one(cfg, local); err != nil {
					failed.Add(1)
					errs.Add(err.Error())
					continue
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	use := win.End()
	r := result{Addr: *addr, Version: *version, Resume: *resume, Conns: *conns, Concurrency: *concurrency,
		Done: done.Load(), Resumed: resumed.Load(), Failed: failed.Load(), Errors: errs.Snapshot(),
		Seconds: elapsed, PerSecond: float64(done.Load()) / elapsed}
	if use.ServerOK && use.ServerTicks > 0 && done.Load() > 0 {
		secs := float64(use.ServerTicks) / float64(c.ClkTck)
		r.ServerCPUSeconds = secs
		r.PerServerCPUSec = float64(done.Load()) / secs
		r.ServerCPUUSPerHS = secs * 1e6 / float64(done.Load())
	}
	loadkit.WriteJSON(r)
	if done.Load() == 0 {
		os.Exit(1)
	}
}
