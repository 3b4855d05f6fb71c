package loadkit

// Kernel receive timestamps (SO_TIMESTAMPNS) for a subscriber's socket: when
// the last segment a read returned entered the socket, by the kernel's clock
// (CLOCK_REALTIME, the clock publishers stamp messages with). A delivery's
// latency measured to that instant leaves out the reading client's own
// scheduling and parsing, which on a box shared by client and server is most
// of what the client-side latency holds.

import (
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"syscall"

	"github.com/gorilla/websocket"
)

// RxStamp is the kernel's receive time (Unix nanos) of the last segment that
// the connection's latest read returned; 0 before the first stamped read.
// Only the connection's reader touches it.
type RxStamp struct{ Nanos int64 }

// stampConn reads with recvmsg and keeps the kernel's timestamp of each read.
type stampConn struct {
	*net.TCPConn
	raw   syscall.RawConn
	stamp RxStamp
	oob   [64]byte
	wire  *atomic.Int64 // counts bytes read, like countingConn (may be nil)
}

func newStampConn(c net.Conn, wire *atomic.Int64) (*stampConn, error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil, fmt.Errorf("receive timestamps need a TCP connection, got %T", c)
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return nil, err
	}
	if serr != nil {
		return nil, fmt.Errorf("setsockopt SO_TIMESTAMPNS: %w", serr)
	}
	return &stampConn{TCPConn: tc, raw: raw, wire: wire}, nil
}

func (c *stampConn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	var n, oobn int
	var rerr error
	err := c.raw.Read(func(fd uintptr) bool {
		n, oobn, _, _, rerr = syscall.Recvmsg(int(fd), b, c.oob[:], 0)
		return !errors.Is(rerr, syscall.EAGAIN)
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return 0, err
	}
	if n == 0 {
		return 0, io.EOF
	}
	if ts, ok := parseTimestampNS(c.oob[:oobn]); ok {
		c.stamp.Nanos = ts
	}
	if c.wire != nil {
		c.wire.Add(int64(n))
	}
	return n, nil
}

// parseTimestampNS finds SCM_TIMESTAMPNS in a control buffer without
// allocating (syscall.ParseSocketControlMessage allocates per call).
func parseTimestampNS(oob []byte) (int64, bool) {
	const hdr = syscall.SizeofCmsghdr
	for len(oob) >= hdr {
		l := int(binary.NativeEndian.Uint64(oob[0:8]))
		level := int32(binary.NativeEndian.Uint32(oob[8:12]))
		typ := int32(binary.NativeEndian.Uint32(oob[12:16]))
		if l < hdr || l > len(oob) {
			return 0, false
		}
		if level == syscall.SOL_SOCKET && typ == syscall.SCM_TIMESTAMPNS && l >= hdr+16 {
			sec := int64(binary.NativeEndian.Uint64(oob[hdr : hdr+8]))
			nsec := int64(binary.NativeEndian.Uint64(oob[hdr+8 : hdr+16]))
			return sec*1_000_000_000 + nsec, true
		}
		next := (l + 7) &^ 7
		if next > len(oob) {
			return 0, false
		}
		oob = oob[next:]
	}
	return 0, false
}

// Arrival returns the receive-timestamp holder of a connection opened with
// Opener.RxStamps (through TLS too), or nil.
func Arrival(c *websocket.Conn) *RxStamp {
	nc := c.UnderlyingConn()
	if t, ok := nc.(*tls.Conn); ok {
		nc = t.NetConn()
	}
	if s, ok := nc.(*stampConn); ok {
		return &s.stamp
	}
	return nil
}
