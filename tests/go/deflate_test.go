package throngtest

// permessage-deflate (RFC 7692) with gorilla/websocket's Dialer.EnableCompression
// against `throng serve --permessage-deflate`: gorilla offers
// "permessage-deflate; server_no_context_takeover; client_no_context_takeover";
// echoes and channel messages arrive intact, and a recording net.Conn under
// gorilla shows the frames each way with RSV1 set (so compression really
// happened), which the /metrics deflate counters confirm. With the flag off
// nothing is negotiated and the same traffic still works, uncompressed.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

var deflateFlags = []string{"--permessage-deflate", "--deflate-min-size", "256", "--max-message-size", "4MiB"}

// recordingConn keeps every byte read from and written to the connection.
type recordingConn struct {
	net.Conn
	mu            sync.Mutex
	read, written bytes.Buffer
}

func (c *recordingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	c.read.Write(p[:n])
	c.mu.Unlock()
	return n, err
}

func (c *recordingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.mu.Lock()
	c.written.Write(p[:n])
	c.mu.Unlock()
	return n, err
}

// wireFrame is one frame as it crossed the wire: its first byte's bits and the
// (unmasked) payload length.
type wireFrame struct {
	fin    bool
	rsv1   bool
	opcode int
	length int
}

// frames parses the frames after the HTTP head in b (only complete ones).
func frames(b []byte) []wireFrame {
	i := bytes.Index(b, []byte("\r\n\r\n"))
	if i < 0 {
		return nil
	}
	b = b[i+4:]
	var out []wireFrame
	for len(b) >= 2 {
		b0, b1 := b[0], b[1]
		n, j := int(b1&0x7f), 2
		switch n {
		case 126:
			if len(b) < 4 {
				return out
			}
			n, j = int(binary.BigEndian.Uint16(b[2:4])), 4
		case 127:
			if len(b) < 10 {
				return out
			}
			n, j = int(binary.BigEndian.Uint64(b[2:10])), 10
		}
		if b1&0x80 != 0 {
			j += 4
		}
		if len(b) < j+n {
			return out
		}
		out = append(out, wireFrame{fin: b0&0x80 != 0, rsv1: b0&0x40 != 0, opcode: int(b0 & 0x0f), length: n})
		b = b[j+n:]
	}
	return out
}

// dataMessages returns, per data message, whether its first frame had RSV1 set
// and the summed wire length of its frames.
func dataMessages(fs []wireFrame) (rsv1 []bool, lengths []int) {
	inMsg := false
	for _, f := range fs {
		if f.opcode >= 8 {
			continue
		}
		if !inMsg {
			rsv1 = append(rsv1, f.rsv1)
			lengths = append(lengths, 0)
			inMsg = true
		}
		lengths[len(lengths)-1] += f.length
		if f.fin {
			inMsg = false
		}
	}
	return rsv1, lengths
}

func (c *recordingConn) snapshot() (read, written []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]byte(nil), c.read.Bytes()...), append([]byte(nil), c.written.Bytes()...)
}

// dialDeflate dials with compression offered (or not), under a recordingConn.
func dialDeflate(t testing.TB, url string, compress bool) (*websocket.Conn, *http.Response, *recordingConn) {
	t.Helper()
	var rec *recordingConn
	d := &websocket.Dialer{
		HandshakeTimeout:  5 * time.Second,
		EnableCompression: compress,
		NetDial: func(network, addr string) (net.Conn, error) {
			c, err := net.DialTimeout(network, addr, 5*time.Second)
			if err != nil {
				return nil, err
			}
			rec = &recordingConn{Conn: c}
			return rec, nil
		},
	}
	c, resp, err := d.Dial(url, nil)
	if err != nil {
		t.Fatalf("dial %s: %v", url, err)
	}
	t.Cleanup(func() { c.Close() })
	return c, resp, rec
}

// extensionParams splits a Sec-WebSocket-Extensions value into its name and sorted parameters.
func extensionParams(v string) []string {
	var ps []string
	for _, p := range strings.Split(v, ";") {
		ps = append(ps, strings.TrimSpace(p))
	}
	if len(ps) > 1 {
		sort.Strings(ps[1:])
	}
	return ps
}

func metricValue(t testing.TB, s *server, name string) float64 {
	t.Helper()
	resp, err := httpClient.Get(s.HTTPURL("/metrics"))
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == name {
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatalf("metric %s: %q", name, line)
			}
			return v
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

// deflateCounters polls /metrics until ok holds (counters are published at the
// end of an event loop's turn) or 5 s pass, and returns the last values.
func deflateCounters(t testing.TB, s *server, ok func(plain, wire float64) bool) (float64, float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		plain := metricValue(t, s, "throng_deflate_plain_bytes_total")
		wire := metricValue(t, s, "throng_deflate_wire_bytes_total")
		if ok(plain, wire) || time.Now().After(deadline) {
			return plain, wire
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func compressibleText(n int) []byte {
	var b bytes.Buffer
	for i := 0; b.Len() < n; i++ {
		fmt.Fprintf(&b, "{\"i\":%d,\"sym\":\"S%d\",\"px\":%d.25,\"note\":\"ünïcødé ✓\"}\n", i, i%17, 100+i*7%50)
	}
	return []byte(strings.ToValidUTF8(string(b.Bytes()[:n]), "")) // cut may split a character
}

func jsonDoc(i int) []byte {
	type item struct {
		N   int     `json:"n"`
		Sym string  `json:"sym"`
		Px  float64 `json:"px"`
	}
	doc := struct {
		I     int    `json:"i"`
		Items []item `json:"items"`
	}{I: i}
	for k := 0; ; k++ {
		doc.Items = append(doc.Items, item{k, fmt.Sprintf("S%d", k%17), 100 + float64(k)/4})
		b, _ := json.Marshal(doc)
		if len(b) >= 2048 {
			return b
		}
	}
}

func TestDeflateGorillaEchoIsNegotiatedAndCompressed(t *testing.T) {
	s := startServer(t, deflateFlags)
	c, resp, rec := dialDeflate(t, s.URL("/echo"), true)
	got := extensionParams(resp.Header.Get("Sec-WebSocket-Extensions"))
	want := []string{"permessage-deflate", "client_no_context_takeover", "server_no_context_takeover"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("Sec-WebSocket-Extensions %q, want the parameters %v", resp.Header.Get("Sec-WebSocket-Extensions"), want)
	}
	plain0 := metricValue(t, s, "throng_deflate_plain_bytes_total")
	wire0 := metricValue(t, s, "throng_deflate_wire_bytes_total")

	bin := bytes.Repeat([]byte("\x00\x01\x02binary\xff\xfe"), 50_000)
	msgs := []struct {
		typ  int
		data []byte
	}{
		{websocket.TextMessage, compressibleText(1_000_000)},
		{websocket.BinaryMessage, bin},
		{websocket.TextMessage, []byte("small ✓")},
	}
	for _, m := range msgs {
		typ, data := echo(t, c, m.typ, m.data)
		if typ != m.typ || !bytes.Equal(data, m.data) {
			t.Fatalf("echo of %d bytes: type %d, %d bytes back, equal %v", len(m.data), typ, len(data), bytes.Equal(data, m.data))
		}
	}

	read, written := rec.snapshot()
	sentRSV1, _ := dataMessages(frames(written))
	gotRSV1, gotLen := dataMessages(frames(read))
	if len(sentRSV1) != 3 || len(gotRSV1) != 3 {
		t.Fatalf("%d messages sent, %d received on the wire, want 3 each", len(sentRSV1), len(gotRSV1))
	}
	// gorilla compresses everything it sends once negotiated; the server only
	// what reaches --deflate-min-size (256).
	if !sentRSV1[0] || !sentRSV1[1] || !sentRSV1[2] {
		t.Fatalf("gorilla's frames RSV1 %v, want all set", sentRSV1)
	}
	if !gotRSV1[0] || !gotRSV1[1] || gotRSV1[2] {
		t.Fatalf("server's frames RSV1 %v, want set, set, clear", gotRSV1)
	}
	if gotLen[0] > len(msgs[0].data)/3 || gotLen[1] > len(bin)/3 {
		t.Fatalf("server's compressed echoes are %v bytes on the wire for %d and %d", gotLen, len(msgs[0].data), len(bin))
	}
	total := float64(len(msgs[0].data) + len(bin))
	plain, wire := deflateCounters(t, s, func(p, w float64) bool { return p-plain0 >= total })
	if plain-plain0 < total || wire-wire0 <= 0 || wire-wire0 >= (plain-plain0)/3 {
		t.Fatalf("deflate counters moved plain %v -> %v, wire %v -> %v (sent %v bytes compressed)", plain0, plain, wire0, wire, total)
	}
}

func TestDeflateGorillaChannelMessages(t *testing.T) {
	s := startServer(t, deflateFlags)
	raw, _, rawRec := dialDeflate(t, s.URL("/ws/ticks"), true)
	js, resp, _ := dialDeflate(t, s.URL("/ws/ticks?format=json"), true)
	if !strings.HasPrefix(resp.Header.Get("Sec-WebSocket-Extensions"), "permessage-deflate") {
		t.Fatalf("channel endpoint answered %q", resp.Header.Get("Sec-WebSocket-Extensions"))
	}
	waitSubscribers(t, s, "ticks", 2)
	const n = 20
	docs := make([][]byte, n)
	for i := range docs {
		docs[i] = jsonDoc(i)
		if seq := publish(t, s, "ticks", "text/plain; charset=utf-8", docs[i]); seq != i+1 {
			t.Fatalf("publish %d answered seq %d", i, seq)
		}
	}
	for i, doc := range docs {
		typ, got := readMsg(t, raw)
		if typ != websocket.TextMessage || !bytes.Equal(got, doc) {
			t.Fatalf("raw message %d: type %d, %d bytes, want the %d-byte document", i, typ, len(got), len(doc))
		}
		m := readJSON(t, js)
		if str(m, "channel") != "ticks" || num(m, "seq") != i+1 || str(m, "data") != string(doc) {
			t.Fatalf("json message %d: channel %q seq %d, data equal %v", i, str(m, "channel"), num(m, "seq"), str(m, "data") == string(doc))
		}
	}
	read, _ := rawRec.snapshot()
	rsv1, lengths := dataMessages(frames(read))
	if len(rsv1) != n {
		t.Fatalf("%d messages on the raw subscriber's wire, want %d", len(rsv1), n)
	}
	for i := range rsv1 {
		if !rsv1[i] || lengths[i] >= len(docs[i]) {
			t.Fatalf("message %d: RSV1 %v, %d bytes on the wire for %d", i, rsv1[i], lengths[i], len(docs[i]))
		}
	}
	plain, wire := deflateCounters(t, s, func(p, w float64) bool { return w > 0 })
	if !(plain > wire && wire > 0) {
		t.Fatalf("deflate counters plain %v wire %v", plain, wire)
	}
}

func TestDeflateGorillaWithTheFlagOffNegotiatesNothing(t *testing.T) {
	s := startServer(t, []string{"--deflate-min-size", "256", "--max-message-size", "4MiB"})
	c, resp, rec := dialDeflate(t, s.URL("/echo"), true)
	if h := resp.Header.Values("Sec-WebSocket-Extensions"); len(h) != 0 {
		t.Fatalf("flag off, yet the server answered %q", h)
	}
	msg := compressibleText(300_000)
	if typ, got := echo(t, c, websocket.TextMessage, msg); typ != websocket.TextMessage || !bytes.Equal(got, msg) {
		t.Fatalf("echo without compression: type %d, %d bytes", typ, len(got))
	}
	sub, _, subRec := dialDeflate(t, s.URL("/ws/plain"), true)
	waitSubscribers(t, s, "plain", 1)
	doc := jsonDoc(1)
	publish(t, s, "plain", "text/plain", doc)
	if typ, got := readMsg(t, sub); typ != websocket.TextMessage || !bytes.Equal(got, doc) {
		t.Fatalf("channel message without compression: type %d %q", typ, got)
	}
	for _, r := range []*recordingConn{rec, subRec} {
		read, written := r.snapshot()
		for _, side := range [][]byte{read, written} {
			rsv1, _ := dataMessages(frames(side))
			for i, set := range rsv1 {
				if set {
					t.Fatalf("message %d has RSV1 set without the extension", i)
				}
			}
		}
	}
	if p, w := deflateCounters(t, s, func(p, w float64) bool { return true }); p != 0 || w != 0 {
		t.Fatalf("deflate counters plain %v wire %v with the flag off", p, w)
	}
}
