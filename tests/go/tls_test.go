package throngtest

// `throng serve --tls-cert --tls-key` against Go's own TLS stack (crypto/tls)
// under gorilla/websocket and net/http: wss:// echo (a 60 KB message too),
// a wss:// channel subscriber and an https:// SSE reader getting what net/http
// publishes over https://, TLS 1.2 and 1.3 each forced once (version, ALPN
// http/1.1 even when h2 is offered), session resumption with a client session
// cache in both versions, an RSA leaf key beside the EC one, and a client that
// does not trust the test CA refused and counted as reason="tls".
//
// Every test makes its own throwaway CA and a leaf for localhost and 127.0.0.1
// with the openssl command-line tool.

import (
	"bufio"
	"bytes"
	"crypto/ecdsa"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
)

// testPKI is a throwaway CA and a server certificate it signed.
type testPKI struct {
	CA   string // the CA certificate (PEM)
	Cert string // the leaf certificate (PEM)
	Key  string // the leaf's private key (PEM, PKCS#8)
	Pool *x509.CertPool
}

func runOpenSSL(t testing.TB, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command("openssl", args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("openssl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// makePKI makes a CA (EC P-256) and a leaf for DNS:localhost and IP:127.0.0.1
// whose key is "ec" (P-256) or "rsa" (2048 bits), both PKCS#8.
func makePKI(t testing.TB, leafKey string) testPKI {
	t.Helper()
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatalf("openssl not found: %v", err)
	}
	dir := t.TempDir()
	runOpenSSL(t, dir, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
		"-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=throng-test-ca")
	switch leafKey {
	case "ec":
		runOpenSSL(t, dir, "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-out", "leaf.key")
	case "rsa":
		runOpenSSL(t, dir, "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", "leaf.key")
	default:
		t.Fatalf("makePKI: unknown key type %q", leafKey)
	}
	runOpenSSL(t, dir, "req", "-new", "-key", "leaf.key", "-out", "leaf.csr", "-subj", "/CN=localhost")
	ext := "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n" +
		"keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
	if err := os.WriteFile(filepath.Join(dir, "leaf.ext"), []byte(ext), 0o600); err != nil {
		t.Fatal(err)
	}
	runOpenSSL(t, dir, "x509", "-req", "-in", "leaf.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
		"-CAcreateserial", "-days", "2", "-sha256", "-extfile", "leaf.ext", "-out", "leaf.pem")

	p := testPKI{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "leaf.pem"), Key: filepath.Join(dir, "leaf.key")}
	key, err := os.ReadFile(p.Key)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(key, []byte("-----BEGIN PRIVATE KEY-----")) {
		t.Fatalf("leaf key is not PKCS#8: %.40q", key)
	}
	caPEM, err := os.ReadFile(p.CA)
	if err != nil {
		t.Fatal(err)
	}
	p.Pool = x509.NewCertPool()
	if !p.Pool.AppendCertsFromPEM(caPEM) {
		t.Fatal("the test CA does not parse")
	}
	return p
}

func startTLSServer(t testing.TB, p testPKI, flags ...string) *server {
	t.Helper()
	return startServer(t, append([]string{"--tls-cert", p.Cert, "--tls-key", p.Key}, flags...))
}

func wssURL(s *server, path string) string {
	return fmt.Sprintf("wss://localhost:%d%s", s.Port, path)
}

func httpsURL(s *server, path string) string {
	return fmt.Sprintf("https://localhost:%d%s", s.Port, path)
}

// tlsDialer is a gorilla Dialer whose TLS trusts only cfg's roots.
func tlsDialer(cfg *tls.Config) *websocket.Dialer {
	return &websocket.Dialer{HandshakeTimeout: 5 * time.Second, TLSClientConfig: cfg}
}

func dialTLS(t testing.TB, d *websocket.Dialer, url string) (*websocket.Conn, tls.ConnectionState) {
	t.Helper()
	c, resp, err := d.Dial(url, nil)
	if err != nil {
		status := 0
		if resp != nil {
			status = resp.StatusCode
		}
		t.Fatalf("dial %s: %v (HTTP status %d)", url, err, status)
	}
	t.Cleanup(func() { c.Close() })
	tc, ok := c.UnderlyingConn().(*tls.Conn)
	if !ok {
		t.Fatalf("dial %s: the connection is a %T, not a *tls.Conn", url, c.UnderlyingConn())
	}
	return c, tc.ConnectionState()
}

// httpsClient is a net/http client over TLS to the test CA only, HTTP/1.1.
func httpsClient(p testPKI) *http.Client {
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		Proxy:             nil,
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{RootCAs: p.Pool, NextProtos: []string{"http/1.1"}},
	}}
}

// publishTLS POSTs body to https://localhost:PORT/api/publish/{channel} and
// returns the seq of {"seq":N} and the TLS state of the request's connection.
func publishTLS(t testing.TB, c *http.Client, s *server, channel string, body []byte) (int, *tls.ConnectionState) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, httpsURL(s, "/api/publish/"+channel), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "text/plain; charset=utf-8")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("publish to %s over https: %v", channel, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("publish to %s over https: HTTP %d %s", channel, resp.StatusCode, raw)
	}
	m := regexp.MustCompile(`^\{"seq":(\d+)`).FindSubmatch(raw)
	if m == nil {
		t.Fatalf("publish answer is not {\"seq\":N}: %q", raw)
	}
	seq, _ := strconv.Atoi(string(m[1]))
	return seq, resp.TLS
}

// getTLS GETs an https path and returns the status and body.
func getTLS(t testing.TB, c *http.Client, s *server, path string) (int, string) {
	t.Helper()
	resp, err := c.Get(httpsURL(s, path))
	if err != nil {
		t.Fatalf("GET %s over https: %v", path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(raw)
}

func waitSubscribersTLS(t testing.TB, c *http.Client, s *server, channel string, n int) {
	t.Helper()
	want := fmt.Sprintf(`"subscribers":%d`, n)
	deadline := time.Now().Add(10 * time.Second)
	for {
		status, body := getTLS(t, c, s, "/api/channels/"+channel)
		if status == http.StatusOK && strings.Contains(body, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("channel %s: want %d subscribers, have HTTP %d %s after 10s", channel, n, status, body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var tlsFailures = regexp.MustCompile(`(?m)^throng_handshake_failures_total\{reason="tls"\} (\d+)$`)

func tlsFailureCount(t testing.TB, c *http.Client, s *server) int {
	t.Helper()
	status, body := getTLS(t, c, s, "/metrics")
	m := tlsFailures.FindStringSubmatch(body)
	if status != http.StatusOK || m == nil {
		t.Fatalf("/metrics over https: HTTP %d, no reason=\"tls\" counter in:\n%s", status, body)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

func tlsVersionName(v uint16) string {
	switch v {
	case tls.VersionTLS12:
		return "TLS 1.2"
	case tls.VersionTLS13:
		return "TLS 1.3"
	}
	return fmt.Sprintf("0x%04x", v)
}

func checkEcho(t testing.TB, c *websocket.Conn) {
	t.Helper()
	typ, got := echo(t, c, websocket.TextMessage, []byte("hello over tls ✓"))
	if typ != websocket.TextMessage || string(got) != "hello over tls ✓" {
		t.Fatalf("text echo: type %d %q", typ, got)
	}
	bin := []byte{0, 1, 2, 0xfe, 0xff, 0x80}
	typ, got = echo(t, c, websocket.BinaryMessage, bin)
	if typ != websocket.BinaryMessage || !bytes.Equal(got, bin) {
		t.Fatalf("binary echo: type %d %v, want %v", typ, got, bin)
	}
	// 60 KB: several TLS records (16 KiB each) each way.
	big := make([]byte, 60*1024)
	for i := range big {
		big[i] = byte(i*7 + i/251)
	}
	typ, got = echo(t, c, websocket.BinaryMessage, big)
	if typ != websocket.BinaryMessage || !bytes.Equal(got, big) {
		t.Fatalf("60 KB echo: type %d, %d bytes back (equal: %v)", typ, len(got), bytes.Equal(got, big))
	}
}

func TestTLSEchoWithGorillaECKey(t *testing.T) {
	p := makePKI(t, "ec")
	s := startTLSServer(t, p)
	d := tlsDialer(&tls.Config{RootCAs: p.Pool})
	c, st := dialTLS(t, d, wssURL(s, "/echo"))
	if !st.HandshakeComplete || len(st.PeerCertificates) == 0 || st.PeerCertificates[0].Subject.CommonName != "localhost" {
		t.Fatalf("unexpected TLS state: complete %v, peer certs %d", st.HandshakeComplete, len(st.PeerCertificates))
	}
	if _, ok := st.PeerCertificates[0].PublicKey.(*ecdsa.PublicKey); !ok {
		t.Fatalf("the server's certificate key is a %T, want ECDSA", st.PeerCertificates[0].PublicKey)
	}
	checkEcho(t, c)
	// The root path echoes too, and 127.0.0.1 is in the certificate.
	root, _ := dialTLS(t, d, fmt.Sprintf("wss://127.0.0.1:%d/", s.Port))
	typ, got := echo(t, root, websocket.TextMessage, []byte("root"))
	if typ != websocket.TextMessage || string(got) != "root" {
		t.Fatalf("echo at / over TLS: type %d %q", typ, got)
	}
}

func TestTLSEchoWithGorillaRSAKey(t *testing.T) {
	p := makePKI(t, "rsa")
	s := startTLSServer(t, p)
	c, st := dialTLS(t, tlsDialer(&tls.Config{RootCAs: p.Pool}), wssURL(s, "/echo"))
	if _, ok := st.PeerCertificates[0].PublicKey.(*rsa.PublicKey); !ok {
		t.Fatalf("the server's certificate key is a %T, want RSA", st.PeerCertificates[0].PublicKey)
	}
	checkEcho(t, c)
}

func TestTLSChannelSubscriberAndSSEGetWhatHTTPSPublishes(t *testing.T) {
	p := makePKI(t, "ec")
	s := startTLSServer(t, p)
	hc := httpsClient(p)
	sub, _ := dialTLS(t, tlsDialer(&tls.Config{RootCAs: p.Pool}), wssURL(s, "/ws/news?format=json"))

	// An SSE reader over https on the same channel.
	sseClient := &http.Client{Transport: &http.Transport{Proxy: nil, TLSClientConfig: &tls.Config{RootCAs: p.Pool}}}
	req, err := http.NewRequest(http.MethodGet, httpsURL(s, "/sse/news"), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := sseClient.Do(req)
	if err != nil {
		t.Fatalf("GET /sse/news over https: %v", err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		t.Fatalf("SSE over https: HTTP %d, Content-Type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	waitSubscribersTLS(t, hc, s, "news", 2)

	for i := 1; i <= 3; i++ {
		seq, st := publishTLS(t, hc, s, "news", []byte(fmt.Sprintf("breaking %d ✓", i)))
		if seq != i {
			t.Fatalf("publish %d over https answered seq %d", i, seq)
		}
		if st == nil || st.NegotiatedProtocol != "http/1.1" {
			t.Fatalf("publish over https: TLS state %+v, want ALPN http/1.1", st)
		}
	}
	for i := 1; i <= 3; i++ {
		m := readJSON(t, sub)
		want := fmt.Sprintf("breaking %d ✓", i)
		if str(m, "channel") != "news" || num(m, "seq") != i || str(m, "data") != want {
			t.Fatalf("wss subscriber message %d: %v, want seq %d data %q", i, m, i, want)
		}
	}

	// The SSE stream carries the three messages as data: lines.
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var data []string
	timeout := time.After(5 * time.Second)
	for len(data) < 3 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("SSE stream ended after data %q", data)
			}
			if strings.HasPrefix(l, "data:") {
				data = append(data, strings.TrimSpace(strings.TrimPrefix(l, "data:")))
			}
		case <-timeout:
			t.Fatalf("SSE over https: only data %q in 5s", data)
		}
	}
	for i, d := range data {
		if !strings.Contains(d, fmt.Sprintf("breaking %d ✓", i+1)) {
			t.Fatalf("SSE data line %d is %q, want it to carry %q", i+1, d, fmt.Sprintf("breaking %d ✓", i+1))
		}
	}
}

func TestTLSVersionsAndALPN(t *testing.T) {
	p := makePKI(t, "ec")
	s := startTLSServer(t, p)
	for _, tc := range []struct {
		name     string
		min, max uint16
		alpn     []string
		wantALPN string
	}{
		{"TLS1.2 offering h2 and http/1.1", tls.VersionTLS12, tls.VersionTLS12, []string{"h2", "http/1.1"}, "http/1.1"},
		{"TLS1.3 offering http/1.1", tls.VersionTLS13, tls.VersionTLS13, []string{"http/1.1"}, "http/1.1"},
		{"TLS1.3 offering no ALPN", tls.VersionTLS13, tls.VersionTLS13, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &tls.Config{RootCAs: p.Pool, MinVersion: tc.min, MaxVersion: tc.max, NextProtos: tc.alpn}
			c, st := dialTLS(t, tlsDialer(cfg), wssURL(s, "/echo"))
			if st.Version != tc.max {
				t.Fatalf("negotiated %s, want %s", tlsVersionName(st.Version), tlsVersionName(tc.max))
			}
			if st.NegotiatedProtocol != tc.wantALPN {
				t.Fatalf("ALPN %q, want %q", st.NegotiatedProtocol, tc.wantALPN)
			}
			msg := []byte("over " + tlsVersionName(st.Version))
			typ, got := echo(t, c, websocket.TextMessage, msg)
			if typ != websocket.TextMessage || !bytes.Equal(got, msg) {
				t.Fatalf("echo: type %d %q, want %q", typ, got, msg)
			}
		})
	}
}

func TestTLSSessionResumption(t *testing.T) {
	p := makePKI(t, "ec")
	s := startTLSServer(t, p)
	for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		t.Run(tlsVersionName(version), func(t *testing.T) {
			cfg := &tls.Config{
				RootCAs: p.Pool, MinVersion: version, MaxVersion: version,
				NextProtos: []string{"http/1.1"}, ClientSessionCache: tls.NewLRUClientSessionCache(8),
			}
			d := tlsDialer(cfg)
			first, st := dialTLS(t, d, wssURL(s, "/echo"))
			if st.DidResume {
				t.Fatal("the first connection resumed a session it cannot have")
			}
			// In TLS 1.3 the ticket comes after the handshake: Go takes it while
			// reading, so a round trip before closing.
			if typ, got := echo(t, first, websocket.TextMessage, []byte("first")); typ != websocket.TextMessage || string(got) != "first" {
				t.Fatalf("first echo: type %d %q", typ, got)
			}
			first.Close()

			second, st := dialTLS(t, d, wssURL(s, "/echo"))
			if st.Version != version {
				t.Fatalf("second connection: %s, want %s", tlsVersionName(st.Version), tlsVersionName(version))
			}
			if !st.DidResume {
				t.Fatalf("the second connection did not resume the first one's session (%s)", tlsVersionName(version))
			}
			if typ, got := echo(t, second, websocket.TextMessage, []byte("second")); typ != websocket.TextMessage || string(got) != "second" {
				t.Fatalf("echo on the resumed connection: type %d %q", typ, got)
			}
		})
	}
}

func TestTLSClientNotTrustingTheCAIsRefusedAndCounted(t *testing.T) {
	p := makePKI(t, "ec")
	s := startTLSServer(t, p)
	hc := httpsClient(p)
	before := tlsFailureCount(t, hc, s)

	// Another CA's client: the server's certificate is unknown to it.
	other := makePKI(t, "ec")
	_, _, err := tlsDialer(&tls.Config{RootCAs: other.Pool}).Dial(wssURL(s, "/echo"), nil)
	var unknown x509.UnknownAuthorityError
	if !errors.As(err, &unknown) {
		t.Fatalf("dial with another CA: %v, want x509.UnknownAuthorityError", err)
	}
	// The client's alert makes the server count one failed TLS handshake.
	deadline := time.Now().Add(5 * time.Second)
	for {
		after := tlsFailureCount(t, hc, s)
		if after > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("throng_handshake_failures_total{reason=\"tls\"} stayed %d after a refused certificate", after)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Plain HTTP to the TLS port: a plaintext 400.
	resp, err := httpClient.Get(fmt.Sprintf("http://127.0.0.1:%d/healthz", s.Port))
	if err != nil {
		t.Fatalf("plain http to the TLS port: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("plain http to the TLS port: HTTP %d, want 400", resp.StatusCode)
	}
	// And the server still serves trusting clients.
	if status, body := getTLS(t, hc, s, "/healthz"); status != http.StatusOK || body != "ok" {
		t.Fatalf("GET /healthz over https after refusals: HTTP %d %q", status, body)
	}
}
