// pubload: closed-loop HTTP publish load for bench/publish_redis.sh.
//
// It runs -publishers goroutines, each with its own keep-alive HTTP connection,
// each publishing one message, waiting for the answer, then publishing the next
// (closed loop: the rate is what the server answers), for -warmup then -duration.
// Publisher i publishes to channel bench-(i % -channels). Two APIs:
//
//	-api throng:     POST /api/publish/{channel}, the message as the body,
//	                 Authorization: Bearer KEY (when -key is set)
//	-api centrifugo: POST /api/publish {"channel": ..., "data": MESSAGE},
//	                 X-API-Key: KEY (Centrifugo answers 200 with {"error": ...} on
//	                 a refusal: such an answer counts as an error)
//
// The message is a JSON object padded to -size bytes (both APIs accept JSON).
// Only the -duration window counts. At the window's start and end (window.go) it
// reads, when asked: INFO commandstats of every Redis in -redis-addr (a list: a
// Cluster's masters, summed per command), the utime+stime of the -redis-pid,
// -server-pid and -proxy-pid processes (lists, summed; clock ticks: the caller
// divides by CLK_TCK), and throng's loop-turn histogram from -metrics-url
// (throng_loop_turn_seconds buckets, their difference over the window, and
// throng_loop_turn_slowest_seconds at both edges).
// Prints one JSON object on stdout.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"throng-bench/clients/internal/loadkit"
)

const prog = "pubload"

type cmdStat struct {
	Calls int64 `json:"calls"`
	Usec  int64 `json:"usec"`
}

type result struct {
	API           string          `json:"api"`
	URL           string          `json:"url"`
	Publishers    int             `json:"publishers"`
	Channels      int             `json:"channels"`
	Size          int             `json:"size"`
	WarmupSecs    float64         `json:"warmup_secs"`
	WindowSecs    float64         `json:"window_secs"`
	Published     int64           `json:"published"`
	PublishesPerS float64         `json:"publishes_per_s"`
	Errors        int64           `json:"errors"`
	ErrorCauses   map[string]int  `json:"error_causes,omitempty"`
	LatencyUs     loadkit.Latency `json:"latency_us"`
	RedisCPUTicks *int64          `json:"redis_cpu_ticks,omitempty"`
	// How many redis-server processes RedisCPUTicks and RedisCmdStats add up.
	RedisProcesses int                `json:"redis_processes,omitempty"`
	RedisCmdStats  map[string]cmdStat `json:"redis_commandstats_delta,omitempty"`
	ServerCPUTicks *int64             `json:"server_cpu_ticks,omitempty"`
	ProxyCPUTicks  *int64             `json:"proxy_cpu_ticks,omitempty"`
	LoopTurns      *loopTurns         `json:"loop_turns,omitempty"`
}

func main() {
	api := flag.String("api", "throng", "throng or centrifugo")
	baseURL := flag.String("url", "http://127.0.0.1:8080", "the server's base URL")
	key := flag.String("key", "", "the API key (throng: Bearer token; centrifugo: X-API-Key)")
	publishers := flag.Int("publishers", 64, "concurrent closed-loop publishers")
	channels := flag.Int("channels", 64, "channels bench-0..bench-(N-1); publisher i uses i%N")
	size := flag.Int("size", 64, "message size in bytes (a JSON object padded to it)")
	warmup := flag.Duration("warmup", time.Second, "publishing before the window (not counted)")
	duration := flag.Duration("duration", 10*time.Second, "the measured window")
	redisAddr := flag.String("redis-addr", "", "host:port[,host:port...] of the server's Redis (INFO commandstats deltas, summed)")
	redisPID := flag.String("redis-pid", "", "redis-server pid[,pid...] (their CPU over the window, summed)")
	serverPID := flag.String("server-pid", "", "the server's pid (its CPU over the window)")
	proxyPID := flag.String("proxy-pid", "", "the pid of a proxy between the server and Redis (its CPU over the window)")
	metricsURL := flag.String("metrics-url", "", "throng's /metrics URL (the loop-turn histogram over the window)")
	flag.Parse()
	if *api != "throng" && *api != "centrifugo" {
		loadkit.Fail(prog, "-api must be throng or centrifugo")
	}
	if *publishers < 1 || *channels < 1 || *size < 16 {
		loadkit.Fail(prog, "-publishers and -channels must be >= 1, -size >= 16")
	}
	base := strings.TrimRight(*baseURL, "/")

	transport := &http.Transport{MaxIdleConnsPerHost: *publishers, MaxConnsPerHost: *publishers,
		IdleConnTimeout: time.Minute, DisableCompression: true}
	client := &http.Client{Transport: transport, Timeout: 10 * time.Second}

	var measuring, stop atomic.Bool
	var published, errors atomic.Int64
	var hist loadkit.ShardedHist
	var causes loadkit.ErrCounter
	var wg sync.WaitGroup
	for i := 0; i < *publishers; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			channel := fmt.Sprintf("bench-%d", i%*channels)
			pad := strings.Repeat("x", max(0, *size-len(`{"p":,"n":"0000000000","x":""}`)-4))
			for n := 0; !stop.Load(); n++ {
				msg := fmt.Sprintf(`{"p":%d,"n":"%010d","x":"%s"}`, i%10000, n, pad)
				var req *http.Request
				var err error
				if *api == "throng" {
					req, err = http.NewRequest(http.MethodPost, base+"/api/publish/"+channel, strings.NewReader(msg))
					if err == nil && *key != "" {
						req.Header.Set("Authorization", "Bearer "+*key)
					}
				} else {
					body := `{"channel":"` + channel + `","data":` + msg + `}`
					req, err = http.NewRequest(http.MethodPost, base+"/api/publish", strings.NewReader(body))
					if err == nil && *key != "" {
						req.Header.Set("X-API-Key", *key)
					}
				}
				if err != nil {
					loadkit.Fail(prog, err.Error())
				}
				req.Header.Set("Content-Type", "application/json")
				counted := measuring.Load()
				start := time.Now()
				resp, err := client.Do(req)
				var answer []byte
				if err == nil {
					answer, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				elapsed := time.Since(start)
				bad := ""
				switch {
				case err != nil:
					bad = err.Error()
				case resp.StatusCode/100 != 2:
					bad = fmt.Sprintf("HTTP %d: %.80s", resp.StatusCode, bytes.TrimSpace(answer))
				case *api == "centrifugo" && bytes.Contains(answer, []byte(`"error"`)):
					bad = fmt.Sprintf("centrifugo error: %.80s", bytes.TrimSpace(answer))
				}
				if !counted || !measuring.Load() {
					continue // started or ended outside the window
				}
				if bad != "" {
					errors.Add(1)
					causes.Add(bad)
					time.Sleep(10 * time.Millisecond) // a refusing server is not spun on
					continue
				}
				published.Add(1)
				hist.Add(i, elapsed.Nanoseconds())
			}
		}(i)
	}

	watch := watched{redisAddrs: splitList(*redisAddr), redisPIDs: parsePIDs("redis-pid", *redisPID),
		serverPIDs: parsePIDs("server-pid", *serverPID), proxyPIDs: parsePIDs("proxy-pid", *proxyPID),
		metricsURL: *metricsURL, client: &http.Client{Timeout: 5 * time.Second}}
	time.Sleep(*warmup)
	before := watch.read()
	windowStart := time.Now()
	measuring.Store(true)
	time.Sleep(*duration)
	measuring.Store(false)
	window := time.Since(windowStart).Seconds()
	after := watch.read()
	res := result{API: *api, URL: base, Publishers: *publishers, Channels: *channels, Size: *size,
		WarmupSecs: warmup.Seconds(), WindowSecs: window}
	watch.fill(&res, before, after)
	stop.Store(true)
	wg.Wait()

	res.Published = published.Load()
	res.Errors = errors.Load()
	res.ErrorCauses = causes.Snapshot()
	res.PublishesPerS = float64(res.Published) / window
	res.LatencyUs = loadkit.Summarize(hist.Merged())
	loadkit.WriteJSON(res)
}
