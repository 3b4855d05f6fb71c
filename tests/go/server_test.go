package throngtest

// Helpers that run the real throng binary as a black box.
//
// The binary comes from $THRONG_BIN (default: <repo>/target/release/throng,
// i.e. ../../target/release/throng relative to this package). Each server is
// started on free loopback port(s), and stopped by PID (SIGTERM, wait,
// SIGKILL fallback) in t.Cleanup; its stdout/stderr are logged if the test failed.

import (
	"bytes"
	"fmt"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var defaultFlags = [][2]string{{"--threads", "2"}, {"--stats-interval", "0"}}

func throngBin(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("THRONG_BIN"); p != "" {
		return p
	}
	p, err := filepath.Abs(filepath.Join("..", "..", "target", "release", "throng"))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// syncBuffer is a goroutine-safe bytes.Buffer for the child's output.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type server struct {
	t      testing.TB
	cmd    *exec.Cmd
	Port   int
	Ports  []int
	stdout *syncBuffer
	stderr *syncBuffer
	done   chan struct{}
	err    error // from cmd.Wait, valid after done is closed
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// freePortRange returns the first of n consecutive free ports.
func freePortRange(t testing.TB, n int) int {
	t.Helper()
	for attempt := 0; attempt < 200; attempt++ {
		base := 20000 + rand.Intn(40000-n)
		var ls []net.Listener
		ok := true
		for p := base; p < base+n; p++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				ok = false
				break
			}
			ls = append(ls, l)
		}
		for _, l := range ls {
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

func hasFlag(flags []string, name string) bool {
	for _, f := range flags {
		if f == name {
			return true
		}
	}
	return false
}

// startServer runs `throng serve` with flags. Without a --listen flag it listens
// on 127.0.0.1:<free port>; with --listen flags, pass the ports to wait for.
func startServer(t testing.TB, flags []string, ports ...int) *server {
	t.Helper()
	bin := throngBin(t)
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("throng binary not found at %s (set THRONG_BIN or cargo build --release): %v", bin, err)
	}
	args := []string{"serve"}
	if !hasFlag(flags, "--listen") {
		p := freePort(t)
		ports = []int{p}
		args = append(args, "--listen", fmt.Sprintf("127.0.0.1:%d", p))
	} else if len(ports) == 0 {
		t.Fatal("startServer: --listen given without ports to wait for")
	}
	for _, df := range defaultFlags {
		if !hasFlag(flags, df[0]) {
			args = append(args, df[0], df[1])
		}
	}
	args = append(args, flags...)

	s := &server{t: t, Port: ports[0], Ports: ports, stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	s.cmd = exec.Command(bin, args...)
	s.cmd.Stdout = s.stdout
	s.cmd.Stderr = s.stderr
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "THRONG_") {
			env = append(env, kv)
		}
	}
	s.cmd.Env = env
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		s.err = s.cmd.Wait()
		close(s.done)
	}()
	t.Cleanup(func() {
		s.Stop()
		if t.Failed() {
			t.Logf("throng %v (pid %d)\n--- stdout ---\n%s\n--- stderr ---\n%s",
				args, s.cmd.Process.Pid, tail(s.stdout.String()), tail(s.stderr.String()))
		}
	})
	s.waitReady(10 * time.Second)
	return s
}

func tail(s string) string {
	const max = 6000
	if len(s) > max {
		return "...[truncated]...\n" + s[len(s)-max:]
	}
	return s
}

func (s *server) waitReady(timeout time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	pending := append([]int(nil), s.Ports...)
	for len(pending) > 0 {
		select {
		case <-s.done:
			s.t.Fatalf("throng exited early (%v)\nstderr:\n%s", s.err, tail(s.stderr.String()))
		default:
		}
		var still []int
		for _, p := range pending {
			c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p), 500*time.Millisecond)
			if err != nil {
				still = append(still, p)
				continue
			}
			c.Close()
		}
		pending = still
		if len(pending) == 0 {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("throng not ready on ports %v after %v\nstderr:\n%s", pending, timeout, tail(s.stderr.String()))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Signal sends sig to the server process by PID.
func (s *server) Signal(sig syscall.Signal) {
	select {
	case <-s.done:
	default:
		_ = syscall.Kill(s.cmd.Process.Pid, sig)
	}
}

// Wait waits up to timeout for exit; returns exit code and whether it exited.
func (s *server) Wait(timeout time.Duration) (int, bool) {
	select {
	case <-s.done:
		return s.cmd.ProcessState.ExitCode(), true
	case <-time.After(timeout):
		return 0, false
	}
}

// Stop: SIGTERM, wait 5s, then SIGKILL.
func (s *server) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGTERM)
	if _, ok := s.Wait(5 * time.Second); ok {
		return
	}
	_ = syscall.Kill(s.cmd.Process.Pid, syscall.SIGKILL)
	s.Wait(5 * time.Second)
}

func (s *server) URL(path string) string { return s.URLPort(s.Port, path) }

func (s *server) URLPort(port int, path string) string {
	return fmt.Sprintf("ws://127.0.0.1:%d%s", port, path)
}
