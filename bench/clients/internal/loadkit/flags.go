package loadkit

import (
	"crypto/tls"
	"crypto/x509"
	"flag"
	"net"
	"os"
	"time"
)

// Common holds the flags both clients take: where connections come from, how
// long a dial may take, and which server process to read in /proc.
type Common struct {
	SourceIPs   string
	ServerPID   int
	ClkTck      int
	DialTimeout time.Duration
	RSSSamples  int
	CAFile      string
	Insecure    bool
}

// Register defines the common flags on the default flag set.
func (c *Common) Register() {
	flag.StringVar(&c.SourceIPs, "source-ips", "", "source address list/range to bind before connect, e.g. 127.0.0.2-127.0.0.254")
	flag.IntVar(&c.ServerPID, "server-pid", 0, "server pid: its VmRSS and utime+stime are read from /proc")
	flag.IntVar(&c.ClkTck, "clk-tck", 100, "clock ticks per second for /proc/PID/stat (getconf CLK_TCK)")
	flag.DurationVar(&c.DialTimeout, "dial-timeout", 10*time.Second, "TCP connect + handshake timeout")
	flag.IntVar(&c.RSSSamples, "rss-samples", 5, "server RSS samples (200 ms apart) before and after; the median is used")
	flag.StringVar(&c.CAFile, "ca", "", "wss://: trust the CA certificates in this PEM file (default: the system roots)")
	flag.BoolVar(&c.Insecure, "insecure", false, "wss://: accept any server certificate (self-signed test certificates)")
}

// TLSConfig is the client TLS configuration for wss:// URLs the flags ask for
// (nil: Go's defaults). A bad -ca file ends the program (status 2).
func (c *Common) TLSConfig(prog string) *tls.Config {
	if c.CAFile == "" && !c.Insecure {
		return nil
	}
	cfg := &tls.Config{InsecureSkipVerify: c.Insecure}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			Fail(prog, err.Error())
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			Fail(prog, "-ca "+c.CAFile+": no PEM certificate in it")
		}
		cfg.RootCAs = pool
	}
	return cfg
}

// Check settles the common flags after parsing and returns the source
// addresses; a bad list ends the program (status 2).
func (c *Common) Check(prog string) []net.IP {
	if c.RSSSamples < 1 {
		c.RSSSamples = 1
	}
	ips, err := ParseSourceIPs(c.SourceIPs)
	if err != nil {
		Fail(prog, err.Error())
	}
	return ips
}

// RSSDelta is the server's VmRSS (-rss-samples, 200 ms apart, median used)
// before the first connection and after all are open, and its RssAnon the
// same way: the JSON fields both clients report.
type RSSDelta struct {
	ServerPID        int     `json:"server_pid,omitempty"`
	RSSBeforeSamples []int64 `json:"server_rss_before_kb_samples,omitempty"`
	RSSAfterSamples  []int64 `json:"server_rss_after_kb_samples,omitempty"`
	RSSBeforeKB      int64   `json:"server_rss_before_kb,omitempty"`
	RSSAfterKB       int64   `json:"server_rss_after_kb,omitempty"`
	RSSBytesPerConn  float64 `json:"server_rss_bytes_per_conn,omitempty"`
	// RssAnon alone (the memory the server made, without its code pages).
	AnonBeforeKB     int64   `json:"server_rss_anon_before_kb,omitempty"`
	AnonAfterKB      int64   `json:"server_rss_anon_after_kb,omitempty"`
	AnonBytesPerConn float64 `json:"server_rss_anon_bytes_per_conn,omitempty"`
}

// RSSBefore samples the server's RSS (with -server-pid) before any connection.
func (c *Common) RSSBefore() RSSDelta {
	d := RSSDelta{ServerPID: c.ServerPID}
	if c.ServerPID > 0 {
		d.RSSBeforeSamples, d.RSSBeforeKB, d.AnonBeforeKB = SampleRSS(c.ServerPID, c.RSSSamples, 200*time.Millisecond)
	}
	return d
}

// RSSAfter samples the server's RSS again once opened connections are open
// and settled, and works out the growth per connection (0 when a sample is
// missing or nothing was opened).
func (c *Common) RSSAfter(d *RSSDelta, opened int64) {
	if c.ServerPID <= 0 {
		return
	}
	d.RSSAfterSamples, d.RSSAfterKB, d.AnonAfterKB = SampleRSS(c.ServerPID, c.RSSSamples, 200*time.Millisecond)
	if opened > 0 && d.RSSBeforeKB > 0 && d.RSSAfterKB > 0 {
		d.RSSBytesPerConn = float64(d.RSSAfterKB-d.RSSBeforeKB) * 1024 / float64(opened)
	}
	if opened > 0 && d.AnonBeforeKB > 0 && d.AnonAfterKB > 0 {
		d.AnonBytesPerConn = float64(d.AnonAfterKB-d.AnonBeforeKB) * 1024 / float64(opened)
	}
}
