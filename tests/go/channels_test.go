package throngtest

// Channels, chat rooms and the publish API, driven with gorilla/websocket and
// net/http against the real binary.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// httpClient never uses proxies and bounds every request.
var httpClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}

func (s *server) HTTPURL(path string) string {
	return fmt.Sprintf("http://127.0.0.1:%d%s", s.Port, path)
}

// publish POSTs body to /api/publish/{channel} and returns the seq from {"seq":N}.
func publish(t testing.TB, s *server, channel, contentType string, body []byte) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.HTTPURL("/api/publish/"+channel), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("publish to %s: %v", channel, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("publish to %s: HTTP %d %s", channel, resp.StatusCode, raw)
	}
	var out struct {
		Seq *int `json:"seq"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || out.Seq == nil {
		t.Fatalf("publish answer is not {\"seq\":N}: %q (%v)", raw, err)
	}
	return *out.Seq
}

type channelInfo struct {
	Channel     string `json:"channel"`
	Subscribers int    `json:"subscribers"`
	LastSeq     int    `json:"last_seq"`
}

func getChannelInfo(t testing.TB, s *server, channel string) channelInfo {
	t.Helper()
	resp, err := httpClient.Get(s.HTTPURL("/api/channels/" + channel))
	if err != nil {
		t.Fatalf("GET /api/channels/%s: %v", channel, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /api/channels/%s: HTTP %d %s", channel, resp.StatusCode, raw)
	}
	var info channelInfo
	if err := json.Unmarshal(raw, &info); err != nil {
		t.Fatalf("channel info %q: %v", raw, err)
	}
	return info
}

// waitSubscribers polls /api/channels/{channel} until it reports n subscribers.
func waitSubscribers(t testing.TB, s *server, channel string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info := getChannelInfo(t, s, channel)
		if info.Subscribers == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("channel %s: want %d subscribers, have %+v after 10s", channel, n, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readMsg(t testing.TB, c *websocket.Conn) (int, []byte) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	typ, data, err := c.ReadMessage()
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return typ, data
}

// readJSON reads one frame that must be a JSON object in a text frame.
func readJSON(t testing.TB, c *websocket.Conn) map[string]any {
	t.Helper()
	typ, data := readMsg(t, c)
	if typ != websocket.TextMessage {
		t.Fatalf("expected a JSON text frame, got type %d %q", typ, data)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("not a JSON object: %q (%v)", data, err)
	}
	return m
}

// num returns a JSON number field as int (-1 if missing or not a number).
func num(m map[string]any, key string) int {
	f, ok := m[key].(float64)
	if !ok {
		return -1
	}
	return int(f)
}

func str(m map[string]any, key string) string {
	s, _ := m[key].(string)
	return s
}

func TestChannelRawAndJSONSubscribersInOrder(t *testing.T) {
	const n = 50
	s := startServer(t, nil)
	raw := dial(t, s.URL("/ws/news"))
	js := dial(t, s.URL("/ws/news?format=json"))
	waitSubscribers(t, s, "news", 2)

	for i := 1; i <= n; i++ {
		if seq := publish(t, s, "news", "text/plain; charset=utf-8", []byte(fmt.Sprintf("item %d ✓", i))); seq != i {
			t.Fatalf("publish %d answered seq %d", i, seq)
		}
	}
	for i := 1; i <= n; i++ {
		want := fmt.Sprintf("item %d ✓", i)
		typ, got := readMsg(t, raw)
		if typ != websocket.TextMessage || string(got) != want {
			t.Fatalf("raw subscriber message %d: type %d %q, want text %q", i, typ, got, want)
		}
		m := readJSON(t, js)
		if str(m, "channel") != "news" || num(m, "seq") != i || str(m, "data") != want {
			t.Fatalf("json subscriber message %d: %v, want channel news seq %d data %q", i, m, i, want)
		}
		if _, ok := m["encoding"]; ok {
			t.Fatalf("text message must not carry an encoding: %v", m)
		}
	}
	if info := getChannelInfo(t, s, "news"); info != (channelInfo{"news", 2, n}) {
		t.Fatalf("channel info %+v, want subscribers 2 last_seq %d", info, n)
	}
}

func TestChannelBinaryPayloadAsBinaryFrame(t *testing.T) {
	s := startServer(t, nil)
	raw := dial(t, s.URL("/ws/blobs"))
	js := dial(t, s.URL("/ws/blobs?format=json"))
	waitSubscribers(t, s, "blobs", 2)

	payload := []byte{0x00, 0x01, 0x02, 0xfe, 0xff, 'h', 'i', 0x80}
	publish(t, s, "blobs", "application/octet-stream", payload)
	publish(t, s, "blobs", "", []byte("no content type is binary too"))

	typ, got := readMsg(t, raw)
	if typ != websocket.BinaryMessage || !bytes.Equal(got, payload) {
		t.Fatalf("raw: type %d %v, want binary %v", typ, got, payload)
	}
	typ, got = readMsg(t, raw)
	if typ != websocket.BinaryMessage || string(got) != "no content type is binary too" {
		t.Fatalf("raw, no Content-Type: type %d %q, want a binary frame", typ, got)
	}
	m := readJSON(t, js)
	dec, err := base64.StdEncoding.DecodeString(str(m, "data"))
	if err != nil || !bytes.Equal(dec, payload) || str(m, "encoding") != "base64" || num(m, "seq") != 1 || str(m, "channel") != "blobs" {
		t.Fatalf("json binary envelope %v (decoded %v, %v)", m, dec, err)
	}
}

var clientID = regexp.MustCompile(`^c\d+$`)

func expectEvent(t testing.TB, m map[string]any, event, room, client string, count int) string {
	t.Helper()
	if str(m, "event") != event || str(m, "channel") != room || num(m, "count") != count || !clientID.MatchString(str(m, "client")) {
		t.Fatalf("got %v, want event %q channel %q count %d client c<id>", m, event, room, count)
	}
	if client != "" && str(m, "client") != client {
		t.Fatalf("%s event for %q, want %q: %v", event, str(m, "client"), client, m)
	}
	return str(m, "client")
}

func TestChatRoomBroadcastBetweenTwoClients(t *testing.T) {
	const room = "chat:gophers"
	s := startServer(t, nil)

	a := dial(t, s.URL("/ws/"+room+"?format=json"))
	idA := expectEvent(t, readJSON(t, a), "welcome", room, "", 1)
	b := dial(t, s.URL("/ws/"+room+"?format=json"))
	idB := expectEvent(t, readJSON(t, b), "welcome", room, "", 2)
	if idA == idB {
		t.Fatalf("both clients got id %s", idA)
	}
	expectEvent(t, readJSON(t, a), "join", room, idB, 2)

	send := func(c *websocket.Conn, msg string) {
		c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if err := c.WriteMessage(websocket.TextMessage, []byte(msg)); err != nil {
			t.Fatalf("write: %v", err)
		}
	}
	send(a, "hello from A")
	var seqA int
	for _, c := range []*websocket.Conn{a, b} { // the sender gets its own message too
		m := readJSON(t, c)
		if str(m, "data") != "hello from A" || str(m, "from") != idA || str(m, "channel") != room || num(m, "seq") < 1 {
			t.Fatalf("got %v, want data %q from %s", m, "hello from A", idA)
		}
		seqA = num(m, "seq")
	}
	send(b, "hi A, B here")
	for _, c := range []*websocket.Conn{a, b} {
		m := readJSON(t, c)
		if str(m, "data") != "hi A, B here" || str(m, "from") != idB || num(m, "seq") != seqA+1 {
			t.Fatalf("got %v, want data from %s with seq %d", m, idB, seqA+1)
		}
	}

	// B leaves: A is told, with the count after.
	b.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, ""), time.Now().Add(time.Second))
	expectEvent(t, readJSON(t, a), "leave", room, idB, 1)
}

func TestPushOnlyChannelCloses1008(t *testing.T) {
	s := startServer(t, nil)
	for _, typ := range []int{websocket.TextMessage, websocket.BinaryMessage} {
		c := dial(t, s.URL("/ws/announcements"))
		c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if err := c.WriteMessage(typ, []byte("subscribers may not talk here")); err != nil {
			t.Logf("write returned %v (server may already be closing)", err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, _, err := c.ReadMessage()
		var ce *websocket.CloseError
		if !errors.As(err, &ce) {
			t.Fatalf("message type %d: expected *websocket.CloseError, got %T %v", typ, err, err)
		}
		if ce.Code != websocket.ClosePolicyViolation || !strings.Contains(strings.ToLower(ce.Text), "push-only") {
			t.Fatalf("message type %d: close %d %q, want 1008 mentioning push-only", typ, ce.Code, ce.Text)
		}
	}
}

func TestBadChannelNameIs400(t *testing.T) {
	s := startServer(t, nil)
	for _, path := range []string{"/ws/bad%20name", "/ws/" + strings.Repeat("x", 201), "/ws/caf%C3%A9", "/ws/a*b"} {
		c, resp, err := dialer().Dial(s.URL(path), nil)
		if err == nil {
			c.Close()
			t.Fatalf("%s: handshake succeeded, want HTTP 400", path)
		}
		if !errors.Is(err, websocket.ErrBadHandshake) || resp == nil {
			t.Fatalf("%s: expected a bad handshake with a response, got %v", path, err)
		}
		if resp.StatusCode != http.StatusBadRequest {
			t.Fatalf("%s: status %d, want 400", path, resp.StatusCode)
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		var j struct {
			Error  string `json:"error"`
			Status int    `json:"status"`
		}
		if err := json.Unmarshal(body, &j); err != nil || j.Status != 400 || !strings.Contains(strings.ToLower(j.Error), "channel name") {
			t.Fatalf("%s: body %q (%v), want JSON error mentioning channel name", path, body, err)
		}
	}
	// 200 bytes is still fine.
	c := dial(t, s.URL("/ws/"+strings.Repeat("x", 200)))
	c.Close()
}
