package loadkit

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorilla/websocket"
)

// ParseSourceIPs parses a list of IPv4 addresses and ranges
// ("127.0.0.2-127.0.0.254,10.0.0.1") to bind before connecting; "" = none.
func ParseSourceIPs(spec string) ([]net.IP, error) {
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

// Opener opens many WebSockets, paced, spread over source addresses.
type Opener struct {
	Prog     string             // names the progress lines on stderr
	Conns    int                // connections to open
	Rate     float64            // dials started per second (0 = unpaced)
	IPs      []net.IP           // source addresses, used in turn (none: the kernel picks)
	Timeout  time.Duration      // bounds connect and handshake of one dial
	ReadBuf  int                // gorilla's buffer sizes (0 = its default)
	WriteBuf int                //
	URL      func(i int) string // where connection i goes
	TLS      *tls.Config        // for wss:// URLs (nil: Go's defaults, the system roots)
	// Deflate offers permessage-deflate (gorilla's Dialer.EnableCompression: the
	// offer "permessage-deflate; server_no_context_takeover;
	// client_no_context_takeover"; gorilla refuses an answer without both
	// no_context_takeover parameters, a dial error) and tallies what the server
	// answered in Opening.Deflate.
	Deflate bool
	// WireRead, if set, counts every byte read from the connections' sockets
	// (TCP payload: with wss://, TLS records), handshake included.
	WireRead *atomic.Int64
	// RxStamps turns on SO_TIMESTAMPNS and reads with recvmsg, so that
	// Arrival(conn) gives the kernel's receive time of the latest read.
	RxStamps bool
}

// Opening is what both clients report about opening their connections.
type Opening struct {
	SourceIPs   int             `json:"source_ips"`
	Opened      int64           `json:"opened"`
	Failed      int64           `json:"failed"`
	DialErrors  map[string]int  `json:"dial_errors,omitempty"`
	OpenSeconds float64         `json:"open_seconds"`
	Deflate     *DeflateOpening `json:"deflate,omitempty"`
}

// DeflateOpening: with Opener.Deflate, what the servers answered to the offer.
type DeflateOpening struct {
	Offered string `json:"offered"`
	// Negotiated: opened connections whose 101 answer accepted permessage-deflate.
	Negotiated int64 `json:"negotiated"`
	// Extensions: the answers' Sec-WebSocket-Extensions header, exactly as sent
	// ("(none)" when absent), and how many opened connections got each.
	Extensions map[string]int `json:"extensions"`
}

// DeflateOffer is what gorilla's client offers with EnableCompression.
const DeflateOffer = "permessage-deflate; server_no_context_takeover; client_no_context_takeover"

// countingConn adds every byte read to n.
type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Read(b []byte) (int, error) {
	k, err := c.Conn.Read(b)
	if k > 0 {
		c.n.Add(int64(k))
	}
	return k, err
}

func (o *Opener) dialers() []*websocket.Dialer {
	mk := func(local net.Addr) *websocket.Dialer {
		nd := &net.Dialer{Timeout: o.Timeout, LocalAddr: local}
		dial := nd.DialContext
		if o.RxStamps {
			dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := nd.DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				sc, err := newStampConn(c, o.WireRead)
				if err != nil {
					c.Close()
					return nil, err
				}
				return sc, nil
			}
		} else if o.WireRead != nil {
			dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
				c, err := nd.DialContext(ctx, network, addr)
				if err != nil {
					return nil, err
				}
				return &countingConn{Conn: c, n: o.WireRead}, nil
			}
		}
		return &websocket.Dialer{NetDialContext: dial, HandshakeTimeout: o.Timeout,
			ReadBufferSize: o.ReadBuf, WriteBufferSize: o.WriteBuf, TLSClientConfig: o.TLS,
			EnableCompression: o.Deflate}
	}
	var out []*websocket.Dialer
	if len(o.IPs) == 0 {
		out = append(out, mk(nil))
	}
	for _, ip := range o.IPs {
		out = append(out, mk(&net.TCPAddr{IP: ip}))
	}
	return out
}

// Open dials o.Conns connections (connection i from source address i%len)
// and calls onOpen(i, conn) in the dialing goroutine for each success. It
// returns when every dial has finished.
func (o *Opener) Open(onOpen func(i int, c *websocket.Conn)) Opening {
	dialers := o.dialers()
	var errs ErrCounter
	var wg sync.WaitGroup
	var nOK, nFail, nDeflate atomic.Int64
	var extMu sync.Mutex
	exts := map[string]int{}
	start := time.Now()
	for i := 0; i < o.Conns; i++ {
		if o.Rate > 0 {
			due := start.Add(time.Duration(float64(i) / o.Rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			c, resp, err := dialers[i%len(dialers)].Dial(o.URL(i), nil)
			if err != nil {
				if resp != nil {
					err = fmt.Errorf("%w (HTTP %d)", err, resp.StatusCode)
				}
				errs.Add(err.Error())
				nFail.Add(1)
				return
			}
			nOK.Add(1)
			if o.Deflate {
				ext := strings.Join(resp.Header.Values("Sec-WebSocket-Extensions"), ", ")
				if ext == "" {
					ext = "(none)"
				}
				if strings.Contains(ext, "permessage-deflate") {
					nDeflate.Add(1)
				}
				extMu.Lock()
				if len(exts) < 20 || exts[ext] > 0 {
					exts[ext]++
				} else {
					exts["(other)"]++
				}
				extMu.Unlock()
			}
			onOpen(i, c)
		}(i)
		if (i+1)%5000 == 0 {
			fmt.Fprintf(os.Stderr, "%s: dialed %d/%d\n", o.Prog, i+1, o.Conns)
		}
	}
	wg.Wait()
	out := Opening{SourceIPs: len(o.IPs), Opened: nOK.Load(), Failed: nFail.Load(), DialErrors: errs.Snapshot(),
		OpenSeconds: time.Since(start).Seconds()}
	if o.Deflate {
		out.Deflate = &DeflateOpening{Offered: DeflateOffer, Negotiated: nDeflate.Load(), Extensions: exts}
	}
	return out
}

// CloseAll closes conns politely: a close frame to each (256 at a time), 2 s
// for the peer's answer, which ends the readers; after 4 s whatever is left is
// closed by force (then up to 2 s more for the readers). Reports whether
// force was needed.
func CloseAll(conns []*websocket.Conn, readers *sync.WaitGroup) (forced bool) {
	msg := websocket.FormatCloseMessage(websocket.CloseNormalClosure, "")
	var cw sync.WaitGroup
	sem := make(chan struct{}, 256)
	for _, c := range conns {
		cw.Add(1)
		sem <- struct{}{}
		go func(c *websocket.Conn) {
			defer func() { <-sem; cw.Done() }()
			c.WriteControl(websocket.CloseMessage, msg, time.Now().Add(time.Second))
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
		}(c)
	}
	cw.Wait()
	done := make(chan struct{})
	go func() { readers.Wait(); close(done) }()
	select {
	case <-done:
		return false
	case <-time.After(4 * time.Second):
		for _, c := range conns {
			c.Close()
		}
		select {
		case <-done:
		case <-time.After(2 * time.Second):
		}
		return true
	}
}

// ErrCounter tallies error messages by cause (at most 20 distinct, then
// "(other)"); safe for concurrent use.
type ErrCounter struct {
	mu sync.Mutex
	m  map[string]int
}

// Add counts one error message.
func (e *ErrCounter) Add(s string) {
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

// Snapshot returns a copy of the tally (nil when empty).
func (e *ErrCounter) Snapshot() map[string]int {
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

// WriteJSON prints v as one JSON object on stdout (exit status 1 if it cannot).
func WriteJSON(v any) {
	if err := json.NewEncoder(os.Stdout).Encode(v); err != nil {
		os.Exit(1)
	}
}

// Fail prints "prog: msg" on stderr and exits with status 2 (bad arguments).
func Fail(prog, msg string) {
	fmt.Fprintln(os.Stderr, prog+":", msg)
	os.Exit(2)
}
