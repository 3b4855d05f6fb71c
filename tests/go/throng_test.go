package throngtest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

func dialer() *websocket.Dialer {
	return &websocket.Dialer{HandshakeTimeout: 5 * time.Second} // Proxy nil: never use env proxies
}

func dial(t testing.TB, url string) *websocket.Conn {
	t.Helper()
	c, resp, err := dialer().Dial(url, nil)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial %s: %v (HTTP status %d)", url, err, status)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func echo(t testing.TB, c *websocket.Conn, typ int, payload []byte) (int, []byte) {
	t.Helper()
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := c.WriteMessage(typ, payload); err != nil {
		t.Fatalf("write: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	gt, got, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("read echo: %v", err)
	}
	return gt, got
}

// expectClose reads until the server's close frame and returns its code.
func expectClose(t testing.TB, c *websocket.Conn, timeout time.Duration) int {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(timeout))
	for {
		_, _, err := c.ReadMessage()
		if err == nil {
			continue
		}
		var ce *websocket.CloseError
		if errors.As(err, &ce) {
			return ce.Code
		}
		t.Fatalf("expected a close frame, got error %v", err)
	}
}

func TestEchoTextAndBinaryWithPrefix(t *testing.T) {
	s := startServer(t, []string{"--echo-prefix", "P:"})
	c := dial(t, s.URL("/echo"))

	typ, got := echo(t, c, websocket.TextMessage, []byte("hello ✓"))
	if typ != websocket.TextMessage || string(got) != "P:hello ✓" {
		t.Fatalf("text echo: type %d payload %q, want text %q", typ, got, "P:hello ✓")
	}
	bin := []byte{0, 1, 2, 0xff, 'P', ':'}
	typ, got = echo(t, c, websocket.BinaryMessage, bin)
	if typ != websocket.BinaryMessage || !bytes.Equal(got, bin) {
		t.Fatalf("binary echo: type %d payload %v, want binary %v unchanged", typ, got, bin)
	}
}

func TestEchoWithoutPrefixOnRootPath(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s.URL("/"))
	typ, got := echo(t, c, websocket.TextMessage, []byte("plain"))
	if typ != websocket.TextMessage || string(got) != "plain" {
		t.Fatalf("got type %d %q", typ, got)
	}
}

func TestMessageOf60KiBEchoedUnderDefaultLimit(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s.URL("/echo"))
	msg := bytes.Repeat([]byte("0123456789abcdef"), 60*1024/16)
	typ, got := echo(t, c, websocket.BinaryMessage, msg)
	if typ != websocket.BinaryMessage || !bytes.Equal(got, msg) {
		t.Fatalf("60 KiB echo mismatch: type %d len %d", typ, len(got))
	}
}

func TestMessageOf70KiBClosedWith1009(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s.URL("/echo"))
	msg := bytes.Repeat([]byte("x"), 70*1024)
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := c.WriteMessage(websocket.TextMessage, msg); err != nil {
		t.Logf("write returned %v (server may already be closing)", err)
	}
	if code := expectClose(t, c, 5*time.Second); code != websocket.CloseMessageTooBig {
		t.Fatalf("close code %d, want 1009", code)
	}
}

func TestFragmentedWriteIsReassembled(t *testing.T) {
	s := startServer(t, []string{"--echo-prefix", ">"})
	d := dialer()
	d.WriteBufferSize = 256 // gorilla flushes a frame each time the buffer fills
	c, _, err := d.Dial(s.URL("/echo"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var want strings.Builder
	w, err := c.NextWriter(websocket.TextMessage)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 60; i++ {
		// multi-byte characters, so some fragment boundaries fall inside a UTF-8 sequence
		chunk := fmt.Sprintf("chunk-%02d-é✓🚀|", i)
		want.WriteString(chunk)
		if _, err := w.Write([]byte(chunk)); err != nil {
			t.Fatalf("write fragment %d: %v", i, err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	typ, got, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if typ != websocket.TextMessage || string(got) != ">"+want.String() {
		t.Fatalf("reassembled echo mismatch: type %d len %d want len %d", typ, len(got), want.Len()+1)
	}

	// binary too
	w, _ = c.NextWriter(websocket.BinaryMessage)
	var wantBin []byte
	for i := 0; i < 20; i++ {
		chunk := bytes.Repeat([]byte{byte(i)}, 100)
		wantBin = append(wantBin, chunk...)
		w.Write(chunk)
	}
	w.Close()
	typ, got, err = c.ReadMessage()
	if err != nil || typ != websocket.BinaryMessage || !bytes.Equal(got, wantBin) {
		t.Fatalf("binary reassembly: type %d len %d err %v", typ, len(got), err)
	}
}

func TestServerPingsObserved(t *testing.T) {
	s := startServer(t, []string{"--ping-interval", "300ms", "--idle-timeout", "10s"})
	c := dial(t, s.URL("/echo"))
	var pings atomic.Int32
	c.SetPingHandler(func(data string) error {
		pings.Add(1)
		return c.WriteControl(websocket.PongMessage, []byte(data), time.Now().Add(time.Second))
	})
	msgs := make(chan string, 4)
	errc := make(chan error, 1)
	go func() {
		for {
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, m, err := c.ReadMessage()
			if err != nil {
				errc <- err
				return
			}
			msgs <- string(m)
		}
	}()
	time.Sleep(2 * time.Second)
	if n := pings.Load(); n < 3 {
		t.Fatalf("only %d server pings in 2s with --ping-interval 300ms", n)
	}
	if err := c.WriteMessage(websocket.TextMessage, []byte("after pings")); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-msgs:
		if m != "after pings" {
			t.Fatalf("got %q", m)
		}
	case err := <-errc:
		t.Fatalf("connection failed: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("no echo")
	}
}

func TestClose1000Answered(t *testing.T) {
	s := startServer(t, nil)
	c := dial(t, s.URL("/echo"))
	echo(t, c, websocket.TextMessage, []byte("bye"))
	err := c.WriteControl(websocket.CloseMessage,
		websocket.FormatCloseMessage(websocket.CloseNormalClosure, "done"), time.Now().Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if code := expectClose(t, c, 5*time.Second); code != websocket.CloseNormalClosure {
		t.Fatalf("close answered with %d, want 1000", code)
	}
	// Then the server closes TCP.
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16)
	n, err := c.NetConn().Read(buf)
	if err == nil || isTimeout(err) {
		t.Fatalf("TCP not closed by server after close handshake: n=%d err=%v", n, err)
	}
}

func isTimeout(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && ne.Timeout()
}

func TestMaxConns503(t *testing.T) {
	s := startServer(t, []string{"--max-conns", "2"})
	a := dial(t, s.URL("/echo"))
	b := dial(t, s.URL("/echo"))
	echo(t, a, websocket.TextMessage, []byte("a"))
	echo(t, b, websocket.TextMessage, []byte("b"))

	c, resp, err := dialer().Dial(s.URL("/echo"), nil)
	if err == nil {
		c.Close()
		t.Fatal("third handshake succeeded with --max-conns 2")
	}
	if !errors.Is(err, websocket.ErrBadHandshake) || resp == nil {
		t.Fatalf("expected bad handshake with a response, got %v", err)
	}
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", resp.StatusCode)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var j struct {
		Error  string `json:"error"`
		Status int    `json:"status"`
	}
	if err := json.Unmarshal(body, &j); err != nil || j.Status != 503 || j.Error == "" {
		t.Fatalf("503 body not the JSON error shape: %q (%v)", body, err)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("Content-Type %q", ct)
	}
	// existing connections still fine
	echo(t, a, websocket.TextMessage, []byte("still"))
}

func TestPortRangeEcho(t *testing.T) {
	first := freePortRange(t, 5)
	ports := []int{first, first + 1, first + 2, first + 3, first + 4}
	s := startServer(t, []string{"--listen", fmt.Sprintf("127.0.0.1:%d-%d", first, first+4)}, ports...)
	for _, p := range ports {
		c := dial(t, s.URLPort(p, "/echo"))
		msg := fmt.Sprintf("port %d", p)
		if _, got := echo(t, c, websocket.TextMessage, []byte(msg)); string(got) != msg {
			t.Fatalf("port %d: got %q", p, got)
		}
		c.Close()
	}
}

func TestGracefulShutdown1001(t *testing.T) {
	s := startServer(t, []string{"--drain-timeout", "5s"})
	var conns []*websocket.Conn
	for i := 0; i < 8; i++ {
		c := dial(t, s.URL("/echo"))
		echo(t, c, websocket.TextMessage, []byte(fmt.Sprint(i)))
		conns = append(conns, c)
	}
	start := time.Now()
	s.Signal(syscall.SIGTERM)
	codes := make([]int, len(conns))
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func(i int, c *websocket.Conn) {
			defer wg.Done()
			c.SetReadDeadline(time.Now().Add(8 * time.Second))
			for {
				_, _, err := c.ReadMessage()
				if err == nil {
					continue
				}
				var ce *websocket.CloseError
				if errors.As(err, &ce) {
					codes[i] = ce.Code
				} else {
					codes[i] = -1
				}
				return
			}
		}(i, c)
	}
	wg.Wait()
	for i, code := range codes {
		if code != websocket.CloseGoingAway {
			t.Errorf("client %d: close code %d, want 1001 (-1 = no close frame)", i, code)
		}
	}
	code, exited := s.Wait(10 * time.Second)
	if !exited {
		t.Fatal("server still running 10s after SIGTERM (drain timeout 5s)")
	}
	if code != 0 {
		t.Fatalf("exit code %d, want 0", code)
	}
	if el := time.Since(start); el > 8*time.Second {
		t.Fatalf("shutdown took %v with --drain-timeout 5s", el)
	}
}

func TestConcurrentClientsEcho(t *testing.T) {
	const clients, perClient = 100, 50
	s := startServer(t, []string{"--echo-prefix", "#"})
	deadline := time.Now().Add(45 * time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			c, resp, err := dialer().Dial(s.URL("/echo"), nil)
			if err != nil {
				status := 0
				if resp != nil {
					status = resp.StatusCode
				}
				errs <- fmt.Errorf("client %d dial: %v (status %d)", id, err, status)
				return
			}
			defer c.Close()
			c.SetReadDeadline(deadline)
			c.SetWriteDeadline(deadline)
			// Pipeline: writer goroutine sends all, this goroutine reads all in order.
			werr := make(chan error, 1)
			go func() {
				for j := 0; j < perClient; j++ {
					var err error
					if j%5 == 4 {
						err = c.WriteMessage(websocket.BinaryMessage, []byte(fmt.Sprintf("b-%d-%d", id, j)))
					} else {
						err = c.WriteMessage(websocket.TextMessage, []byte(fmt.Sprintf("t-%d-%d", id, j)))
					}
					if err != nil {
						werr <- err
						return
					}
				}
				werr <- nil
			}()
			for j := 0; j < perClient; j++ {
				typ, got, err := c.ReadMessage()
				if err != nil {
					errs <- fmt.Errorf("client %d msg %d read: %v", id, j, err)
					return
				}
				want, wantTyp := fmt.Sprintf("#t-%d-%d", id, j), websocket.TextMessage
				if j%5 == 4 {
					want, wantTyp = fmt.Sprintf("b-%d-%d", id, j), websocket.BinaryMessage
				}
				if typ != wantTyp || string(got) != want {
					errs <- fmt.Errorf("client %d msg %d: got type %d %q, want type %d %q", id, j, typ, got, wantTyp, want)
					return
				}
			}
			if err := <-werr; err != nil {
				errs <- fmt.Errorf("client %d write: %v", id, err)
				return
			}
			c.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(1000, ""), time.Now().Add(time.Second))
		}(i)
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		n++
		if n <= 10 {
			t.Error(err)
		}
	}
	if n > 0 {
		t.Fatalf("%d of %d clients failed", n, clients)
	}
}

// TestSustainedEchoThroughTheRing drives one loop past the rate at which it
// receives through io_uring and waits for batches of completions (the default
// --io-uring auto), and checks every echo comes back whole and in order while
// it does. Bounded: 3 s or 40,000 echoes per client, whichever comes first.
func TestSustainedEchoThroughTheRing(t *testing.T) {
	const clients, maxPerClient = 50, 40000
	s := startServer(t, []string{"--threads", "1"})
	stop := time.Now().Add(3 * time.Second)
	var total atomic.Int64
	var ringSeen atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, clients+1)
	done := make(chan struct{})
	go func() {
		// What /api/stats says while the load runs (as of the loop's last sweep).
		for {
			select {
			case <-done:
				return
			case <-time.After(300 * time.Millisecond):
			}
			resp, err := httpClient.Get(s.HTTPURL("/api/stats"))
			if err != nil {
				continue
			}
			var stats struct {
				Receivers int64 `json:"io_uring_receivers"`
			}
			if json.NewDecoder(resp.Body).Decode(&stats) == nil && stats.Receivers > ringSeen.Load() {
				ringSeen.Store(stats.Receivers)
			}
			resp.Body.Close()
		}
	}()
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			c, _, err := dialer().Dial(s.URL("/echo"), nil)
			if err != nil {
				errs <- fmt.Errorf("client %d dial: %v", id, err)
				return
			}
			defer c.Close()
			c.SetReadDeadline(stop.Add(10 * time.Second))
			for j := 0; j < maxPerClient && time.Now().Before(stop); j++ {
				msg := []byte(fmt.Sprintf("%d-%d-%s", id, j, strings.Repeat("z", j%40)))
				if err := c.WriteMessage(websocket.BinaryMessage, msg); err != nil {
					errs <- fmt.Errorf("client %d write %d: %v", id, j, err)
					return
				}
				_, got, err := c.ReadMessage()
				if err != nil || !bytes.Equal(got, msg) {
					errs <- fmt.Errorf("client %d echo %d: got %q (%v), want %q", id, j, got, err, msg)
					return
				}
				total.Add(1)
			}
		}(i)
	}
	wg.Wait()
	close(done)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("%d echoes in 3 s; at most %d clients seen receiving through io_uring", total.Load(), ringSeen.Load())
	if ioUringUsable() && ringSeen.Load() == 0 {
		t.Errorf("no client was seen receiving through io_uring under load")
	}
}

// ioUringUsable: the kernel lets unprivileged and privileged processes make rings.
func ioUringUsable() bool {
	b, err := os.ReadFile("/proc/sys/kernel/io_uring_disabled")
	return err != nil || strings.TrimSpace(string(b)) == "0"
}
