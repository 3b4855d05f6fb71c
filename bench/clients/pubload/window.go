package main

// What pubload reads at the two edges of the measured window, so that every
// per-publish cost divides a delta taken over exactly the publishes it counts:
// the Redis processes' CPU and INFO commandstats (summed over a Cluster's nodes),
// the server's and the proxy's CPU, and throng's loop-turn histogram from its
// /metrics.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"throng-bench/clients/internal/loadkit"
)

// splitList is a comma-separated flag value without empty items.
func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// parsePIDs reads a comma-separated pid list; a bad one ends the program.
func parsePIDs(flagName, s string) []int {
	var pids []int
	for _, item := range splitList(s) {
		pid, err := strconv.Atoi(item)
		if err != nil || pid <= 0 {
			loadkit.Fail(prog, fmt.Sprintf("-%s: %q is not a pid", flagName, item))
		}
		pids = append(pids, pid)
	}
	return pids
}

// cpuTicks is the utime+stime sum of pids; false when one cannot be read (a
// process gone: the delta would be wrong, so none is reported).
func cpuTicks(pids []int) (int64, bool) {
	var sum int64
	for _, pid := range pids {
		t, err := loadkit.ProcCPUTicks(pid)
		if err != nil {
			return 0, false
		}
		sum += t
	}
	return sum, len(pids) > 0
}

// sumCommandStats asks every Redis in addrs for INFO commandstats and adds them
// up per command (a Cluster's masters each run part of the work); nil when one
// does not answer.
func sumCommandStats(addrs []string) map[string]cmdStat {
	total := map[string]cmdStat{}
	for _, addr := range addrs {
		stats, err := redisCommandStats(addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, prog+": INFO commandstats of "+addr+":", err)
			return nil
		}
		for name, s := range stats {
			t := total[name]
			t.Calls += s.Calls
			t.Usec += s.Usec
			total[name] = t
		}
	}
	return total
}

// redisCommandStats asks Redis at addr for INFO commandstats (plain RESP, no client library).
func redisCommandStats(addr string) (map[string]cmdStat, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "*2\r\n$4\r\nINFO\r\n$12\r\ncommandstats\r\n"); err != nil {
		return nil, err
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(head, "$") {
		return nil, fmt.Errorf("INFO answered %q", strings.TrimSpace(head))
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil {
		return nil, err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	out := map[string]cmdStat{}
	// cmdstat_evalsha:calls=12,usec=345,usec_per_call=28.75,...
	for _, line := range strings.Split(string(body), "\r\n") {
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var s cmdStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				s.Calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				s.Usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = s
	}
	return out, nil
}

// turnScrape is throng's loop-turn histogram as one /metrics scrape shows it.
type turnScrape struct {
	les     []string           // the bucket bounds in the order /metrics lists them
	buckets map[string]float64 // cumulative turns per bound (Prometheus `le`)
	sum     float64
	count   float64
	slowest float64
}

// turnBucket is one bucket's difference over the window: turns that took at
// most `le` seconds (cumulative, as Prometheus counts them).
type turnBucket struct {
	LE    string  `json:"le"`
	Turns float64 `json:"turns"`
}

// loopTurns is the turn histogram's difference over the window, and the longest
// turn since the server started (a gauge: it is not per window) at each edge.
type loopTurns struct {
	Buckets             []turnBucket `json:"buckets_delta"`
	Count               float64      `json:"count_delta"`
	SumSecs             float64      `json:"sum_secs_delta"`
	SlowestSecsBefore   float64      `json:"slowest_secs_before"`
	SlowestSecsAfter    float64      `json:"slowest_secs_after"`
	SlowestGrewInWindow bool         `json:"slowest_grew_in_window"`
}

// scrapeTurns reads throng_loop_turn_seconds and throng_loop_turn_slowest_seconds
// from the server's /metrics.
func scrapeTurns(client *http.Client, url string) (*turnScrape, error) {
	resp, err := client.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered HTTP %d", url, resp.StatusCode)
	}
	s := &turnScrape{buckets: map[string]float64{}}
	seen := false
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "throng_loop_turn_") {
			continue
		}
		name, value, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(name, `throng_loop_turn_seconds_bucket{le="`):
			le := strings.TrimSuffix(strings.TrimPrefix(name, `throng_loop_turn_seconds_bucket{le="`), `"}`)
			s.les = append(s.les, le)
			s.buckets[le] = v
			seen = true
		case name == "throng_loop_turn_seconds_sum":
			s.sum = v
		case name == "throng_loop_turn_seconds_count":
			s.count = v
		case name == "throng_loop_turn_slowest_seconds":
			s.slowest = v
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if !seen {
		return nil, fmt.Errorf("%s has no throng_loop_turn_seconds_bucket", url)
	}
	return s, nil
}

// turnsDelta is after minus before, bucket by bucket.
func turnsDelta(before, after *turnScrape) *loopTurns {
	out := &loopTurns{Count: after.count - before.count, SumSecs: after.sum - before.sum,
		SlowestSecsBefore: before.slowest, SlowestSecsAfter: after.slowest,
		SlowestGrewInWindow: after.slowest > before.slowest}
	for _, le := range after.les {
		out.Buckets = append(out.Buckets, turnBucket{LE: le, Turns: after.buckets[le] - before.buckets[le]})
	}
	return out
}

// edge is what one edge of the window read; the *OK fields say what could be.
type edge struct {
	cmdStats    map[string]cmdStat
	redisTicks  int64
	redisOK     bool
	serverTicks int64
	serverOK    bool
	proxyTicks  int64
	proxyOK     bool
	turns       *turnScrape
}

// watched is what to read at the edges (empty: not read).
type watched struct {
	redisAddrs []string
	redisPIDs  []int
	serverPIDs []int
	proxyPIDs  []int
	metricsURL string
	client     *http.Client
}

func (w *watched) read() edge {
	var e edge
	if len(w.redisAddrs) > 0 {
		e.cmdStats = sumCommandStats(w.redisAddrs)
	}
	e.redisTicks, e.redisOK = cpuTicks(w.redisPIDs)
	e.serverTicks, e.serverOK = cpuTicks(w.serverPIDs)
	e.proxyTicks, e.proxyOK = cpuTicks(w.proxyPIDs)
	if w.metricsURL != "" {
		t, err := scrapeTurns(w.client, w.metricsURL)
		if err != nil {
			fmt.Fprintln(os.Stderr, prog+": /metrics:", err)
		}
		e.turns = t
	}
	return e
}

// fill puts the window's deltas (after minus before) into res.
func (w *watched) fill(res *result, before, after edge) {
	ticks := func(ok1, ok2 bool, a, b int64) *int64 {
		if !ok1 || !ok2 {
			return nil
		}
		d := b - a
		return &d
	}
	res.RedisCPUTicks = ticks(before.redisOK, after.redisOK, before.redisTicks, after.redisTicks)
	res.ServerCPUTicks = ticks(before.serverOK, after.serverOK, before.serverTicks, after.serverTicks)
	res.ProxyCPUTicks = ticks(before.proxyOK, after.proxyOK, before.proxyTicks, after.proxyTicks)
	if len(w.redisPIDs) > 0 {
		res.RedisProcesses = len(w.redisPIDs)
	}
	if before.cmdStats != nil && after.cmdStats != nil {
		res.RedisCmdStats = map[string]cmdStat{}
		for name, s := range after.cmdStats {
			d := cmdStat{Calls: s.Calls - before.cmdStats[name].Calls, Usec: s.Usec - before.cmdStats[name].Usec}
			if d.Calls > 0 {
				res.RedisCmdStats[name] = d
			}
		}
	}
	if before.turns != nil && after.turns != nil {
		res.LoopTurns = turnsDelta(before.turns, after.turns)
	}
}
