// gorilla-hub: a fan-out peer for throng's benchmark, built the way Go
// services commonly do pub/sub on gorilla/websocket (the design of gorilla's
// chat example, generalised to named channels): a hub maps each channel to the
// set of its clients under one mutex; each client has a buffered send channel
// (256 messages) drained by its own writer goroutine, and a reader goroutine
// that notices the close and answers pings/pongs. Publishing pushes the
// payload to every subscriber's send channel without blocking; a client whose
// buffer is full is dropped (its send channel closed, the connection closed),
// as in the example.
//
// Same API as throng's channel endpoints (raw format only):
//
//	WebSocket  /ws/{channel}              each published payload as one frame
//	POST       /api/publish/{channel}     body = payload; {"seq":N} per channel
//	GET        /api/stats                 subscribers, published, dropped counters
//	GET        /healthz                   ok
//
// Usage: gorilla-hub [-addr 127.0.0.1:8080]
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorilla/websocket"
)

const (
	writeWait      = 10 * time.Second    // time allowed to write a message
	pongWait       = 60 * time.Second    // time allowed to read the next pong
	pingPeriod     = (pongWait * 9) / 10 // ping period, less than pongWait
	maxMessageSize = 512                 // from subscribers (they send nothing)
	sendBuffer     = 256                 // messages queued per client
	maxPublishSize = 64 << 10
)

var upgrader = websocket.Upgrader{
	ReadBufferSize:  1024,
	WriteBufferSize: 1024,
	CheckOrigin:     func(r *http.Request) bool { return true }, // benchmark peer
}

type message struct {
	binary bool
	data   []byte
}

type client struct {
	hub  *hub
	ch   *channel
	conn *websocket.Conn
	send chan message
}

type channel struct {
	clients map[*client]struct{}
	seq     uint64
}

type hub struct {
	mu       sync.Mutex
	channels map[string]*channel

	subscribers atomic.Int64
	published   atomic.Int64
	dropped     atomic.Int64 // clients dropped because their send buffer was full
}

func (h *hub) channelLocked(name string) *channel {
	ch := h.channels[name]
	if ch == nil {
		ch = &channel{clients: map[*client]struct{}{}}
		h.channels[name] = ch
	}
	return ch
}

func (h *hub) register(name string, c *client) {
	h.mu.Lock()
	c.ch = h.channelLocked(name)
	c.ch.clients[c] = struct{}{}
	h.mu.Unlock()
	h.subscribers.Add(1)
}

func (h *hub) unregister(c *client) {
	h.mu.Lock()
	if _, ok := c.ch.clients[c]; ok {
		delete(c.ch.clients, c)
		close(c.send)
	}
	h.mu.Unlock()
	h.subscribers.Add(-1)
}

// publish queues m for every subscriber of name and returns the channel's seq.
func (h *hub) publish(name string, m message) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := h.channelLocked(name)
	ch.seq++
	for c := range ch.clients {
		select {
		case c.send <- m:
		default: // slow client: drop it, as gorilla's chat hub does
			close(c.send)
			delete(ch.clients, c)
			h.dropped.Add(1)
		}
	}
	h.published.Add(1)
	return ch.seq
}

// readPump reads (and discards) what the subscriber sends, so that pings,
// pongs and the close handshake are processed; it unregisters on error.
func (c *client) readPump() {
	defer func() {
		c.hub.unregister(c)
		c.conn.Close()
	}()
	c.conn.SetReadLimit(maxMessageSize)
	c.conn.SetReadDeadline(time.Now().Add(pongWait))
	c.conn.SetPongHandler(func(string) error { c.conn.SetReadDeadline(time.Now().Add(pongWait)); return nil })
	for {
		if _, _, err := c.conn.ReadMessage(); err != nil {
			return
		}
	}
}

// writePump sends queued messages, one frame each, and pings periodically.
func (c *client) writePump() {
	ticker := time.NewTicker(pingPeriod)
	defer func() {
		ticker.Stop()
		c.conn.Close()
	}()
	for {
		select {
		case m, ok := <-c.send:
			c.conn.SetWriteDeadline(time.Now().Add(writeWait))
			if !ok { // the hub closed the channel
				c.conn.WriteMessage(websocket.CloseMessage, []byte{})
				return
			}
			mt := websocket.TextMessage
			if m.binary {
				mt = websocket.BinaryMessage
			}
			if err := c.conn.WriteMessage(mt, m.data); err != nil {
				return
			}
		case <-ticker.C:
			c.conn.SetWriteDeadline(time.Now().Add(writeWait))
			if err := c.conn.WriteMessage(websocket.PingMessage, nil); err != nil {
				return
			}
		}
	}
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !(b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || strings.IndexByte("_-.:@", b) >= 0) {
			return false
		}
	}
	return true
}

func serveWs(h *hub, w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("channel")
	if !validName(name) {
		http.Error(w, "bad channel name", http.StatusBadRequest)
		return
	}
	c := &client{hub: h, send: make(chan message, sendBuffer)}
	// Register before the 101 goes out: a client that saw the handshake
	// complete gets every message published after it (queued until the
	// writer starts).
	h.register(name, c)
	conn, err := upgrader.Upgrade(w, r, nil)
	if err != nil {
		h.unregister(c)
		return // Upgrade already answered with an HTTP error
	}
	c.conn = conn
	go c.writePump()
	go c.readPump()
}

func servePublish(h *hub, w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("channel")
	if !validName(name) {
		http.Error(w, "bad channel name", http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPublishSize))
	if err != nil {
		http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
		return
	}
	binary := !strings.HasPrefix(r.Header.Get("Content-Type"), "text/")
	seq := h.publish(name, message{binary: binary, data: body})
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, "{\"seq\":%d}", seq)
}

func (h *hub) statsJSON() string {
	h.mu.Lock()
	n := len(h.channels)
	h.mu.Unlock()
	return fmt.Sprintf(`{"subscribers":%d,"channels":%d,"published":%d,"dropped_slow_clients":%d}`,
		h.subscribers.Load(), n, h.published.Load(), h.dropped.Load())
}

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	flag.Parse()
	h := &hub{channels: map[string]*channel{}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ws/{channel}", func(w http.ResponseWriter, r *http.Request) { serveWs(h, w, r) })
	mux.HandleFunc("POST /api/publish/{channel}", func(w http.ResponseWriter, r *http.Request) { servePublish(h, w, r) })
	mux.HandleFunc("GET /api/stats", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, h.statsJSON())
	})
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		log.Printf("gorilla-hub stats %s", h.statsJSON())
		os.Exit(0)
	}()
	log.Printf("gorilla-hub listening on %s", *addr)
	log.Fatal(http.ListenAndServe(*addr, mux))
}
