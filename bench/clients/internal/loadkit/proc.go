// Package loadkit is what the benchmark's load clients (wsload, fanload)
// share: readings from /proc (the server's CPU time and VmRSS, this process's
// CPU, the machine's and other processes' load over a measured window), source
// addresses and paced dialing, a latency histogram, error tallies and the JSON
// output.
package loadkit

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ProcStatFields returns the fields of /proc/PID/stat after the command name:
// f[0] is field 3 (state), f[6] the flags, f[11..14] utime, stime, cutime,
// cstime.
func ProcStatFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, errors.New("bad stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return nil, errors.New("short stat")
	}
	return f, nil
}

// ProcCPUTicks returns utime+stime of pid (clock ticks).
func ProcCPUTicks(pid int) (int64, error) {
	ut, st, err := ProcCPUTicksSplit(pid)
	return ut + st, err
}

// ProcCPUTicksSplit returns utime and stime of pid (clock ticks).
func ProcCPUTicksSplit(pid int) (int64, int64, error) {
	f, err := ProcStatFields(pid)
	if err != nil {
		return 0, 0, err
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, errors.New("bad stat numbers")
	}
	return ut, st, nil
}

// ServerPIDs is pid and its child processes: a server that runs workers
// (nginx's master and its worker processes) is measured whole.
func ServerPIDs(pid int) []int {
	if pid <= 0 {
		return nil
	}
	pids := []int{pid}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return pids
	}
	for _, e := range ents {
		child, err := strconv.Atoi(e.Name())
		if err != nil || child == pid {
			continue
		}
		if f, err := ProcStatFields(child); err == nil && f[1] == strconv.Itoa(pid) {
			pids = append(pids, child)
		}
	}
	return pids
}

// ServerCPUTicks returns utime+stime of pid and its children (clock ticks).
func ServerCPUTicks(pid int) (int64, error) {
	ut, st, err := ServerCPUTicksSplit(pid)
	return ut + st, err
}

// ServerCPUTicksSplit returns utime and stime of pid and its children (clock ticks).
func ServerCPUTicksSplit(pid int) (int64, int64, error) {
	var ut, st int64
	for i, p := range ServerPIDs(pid) {
		u, s, err := ProcCPUTicksSplit(p)
		if err != nil && i == 0 {
			return 0, 0, err
		}
		ut += u
		st += s
	}
	return ut, st, nil
}

// ProcRSSKB returns VmRSS of pid in KiB.
func ProcRSSKB(pid int) (int64, error) {
	return procStatusKB(pid, "VmRSS:")
}

// procStatusKB returns one KiB field of /proc/PID/status (e.g. "RssAnon:").
func procStatusKB(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, field) {
			if f := strings.Fields(line); len(f) >= 2 {
				return strconv.ParseInt(f[1], 10, 64)
			}
		}
	}
	return 0, errors.New("no " + strings.TrimSuffix(field, ":"))
}

// SampleRSS takes n samples of pid's VmRSS and RssAnon spaced by gap and
// returns the VmRSS samples, their median and the median RssAnon (-1 where
// none could be read). VmRSS counts the binary's code pages too, which the
// first connections may fault in; RssAnon is the memory the process made.
func SampleRSS(pid, n int, gap time.Duration) ([]int64, int64, int64) {
	var out, anon []int64
	for i := 0; i < n; i++ {
		if i > 0 {
			time.Sleep(gap)
		}
		if v, err := ProcRSSKB(pid); err == nil {
			out = append(out, v)
		}
		if v, err := procStatusKB(pid, "RssAnon:"); err == nil {
			anon = append(anon, v)
		}
	}
	return out, median(out), median(anon)
}

func median(samples []int64) int64 {
	if len(samples) == 0 {
		return -1
	}
	s := append([]int64(nil), samples...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// MachineTicks is the first line of /proc/stat (all CPUs) in ticks of USER_HZ.
type MachineTicks struct {
	Busy  int64 // all but idle, iowait and steal
	Idle  int64 // idle + iowait
	IRQ   int64 // irq + softirq
	Steal int64
}

// MachineStat reads /proc/stat (zero on failure).
func MachineStat() MachineTicks {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return MachineTicks{}
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return MachineTicks{}
	}
	n := func(i int) int64 { v, _ := strconv.ParseInt(f[i], 10, 64); return v }
	var tot int64
	for i := 1; i <= 8; i++ {
		tot += n(i)
	}
	idle := n(4) + n(5)
	return MachineTicks{Busy: tot - idle - n(8), Idle: idle, IRQ: n(6) + n(7), Steal: n(8)}
}

func (m MachineTicks) sub(o MachineTicks) MachineTicks {
	return MachineTicks{Busy: m.Busy - o.Busy, Idle: m.Idle - o.Idle, IRQ: m.IRQ - o.IRQ, Steal: m.Steal - o.Steal}
}

// UserHZSeconds converts ticks of USER_HZ (100 on Linux, /proc/stat) to seconds.
func UserHZSeconds(ticks int64) float64 { return float64(ticks) / 100 }

// OthersCPU returns, per pid, utime+stime+cutime+cstime (ticks) of every
// user-space process except the excluded pids. Children that exit and are
// reaped show up in their parent's cutime/cstime. Kernel threads are skipped
// (ksoftirqd etc. do the loopback work of the benchmark itself).
func OthersCPU(exclude ...int) map[int]int64 {
	out := map[int]int64{}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
next:
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		for _, x := range exclude {
			if pid == x {
				continue next
			}
		}
		f, err := ProcStatFields(pid)
		if err != nil {
			continue
		}
		flags, _ := strconv.ParseUint(f[6], 10, 64)
		if flags&0x00200000 != 0 { // PF_KTHREAD
			continue
		}
		var sum int64
		for _, k := range []int{11, 12, 13, 14} {
			v, _ := strconv.ParseInt(f[k], 10, 64)
			sum += v
		}
		out[pid] = sum
	}
	return out
}

// OthersDelta is the CPU (ticks) the processes of b used since a; a process
// that started in between counts whole.
func OthersDelta(a, b map[int]int64) int64 {
	var d int64
	for pid, v := range b {
		if v0, ok := a[pid]; ok {
			if v > v0 {
				d += v - v0
			}
		} else {
			d += v // started during the window
		}
	}
	return d
}

// SelfCPU is this process's user+system CPU time so far.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Window measures a load window: the server's utime+stime (with a server pid;
// its child processes included), this process's CPU, the machine's /proc/stat
// and the CPU of every other user-space process (a gauge of disturbance by
// other sessions on a shared machine).
type Window struct {
	serverPID int
	srv0      int64
	srvSys0   int64
	srvErr    error
	cli0      time.Duration
	m0        MachineTicks
	others0   map[int]int64
	wall0     time.Time
}

// Usage is what a Window measured.
type Usage struct {
	Seconds       float64      // wall-clock length
	ServerOK      bool         // the server pid was given and read at both ends
	ServerTicks   int64        // server utime+stime (clock ticks), if ServerOK
	ServerSys     int64        // of which stime (clock ticks)
	ClientSeconds float64      // this process's CPU
	Machine       MachineTicks // /proc/stat difference (USER_HZ ticks)
	OthersTicks   int64        // other user-space processes (clock ticks)
}

// StartWindow takes the readings at the start of a window; serverPID 0 = no server.
func StartWindow(serverPID int) *Window {
	w := &Window{serverPID: serverPID, srvErr: errors.New("no server pid")}
	if serverPID > 0 {
		var ut int64
		ut, w.srvSys0, w.srvErr = ServerCPUTicksSplit(serverPID)
		w.srv0 = ut + w.srvSys0
	}
	w.cli0 = SelfCPU()
	w.m0 = MachineStat()
	w.others0 = OthersCPU(append(ServerPIDs(serverPID), os.Getpid())...)
	w.wall0 = time.Now()
	return w
}

// End takes the readings at the end of the window.
func (w *Window) End() Usage {
	others1 := OthersCPU(append(ServerPIDs(w.serverPID), os.Getpid())...)
	m1 := MachineStat()
	cli1 := SelfCPU()
	u := Usage{Machine: m1.sub(w.m0), OthersTicks: OthersDelta(w.others0, others1), ClientSeconds: (cli1 - w.cli0).Seconds()}
	if w.srvErr == nil {
		if ut, st, err := ServerCPUTicksSplit(w.serverPID); err == nil {
			u.ServerOK, u.ServerTicks, u.ServerSys = true, ut+st-w.srv0, st-w.srvSys0
		}
	}
	u.Seconds = time.Since(w.wall0).Seconds()
	return u
}

// Timeline sleeps until end and returns, for every whole second after start
// that ends by then, how much count() grew in that second (from the value
// from at start): to spot stalls or drift in a window.
func Timeline(start, end time.Time, from int64, count func() int64) []int64 {
	var out []int64
	last := from
	for sec := 1; ; sec++ {
		next := start.Add(time.Duration(sec) * time.Second)
		if next.After(end) {
			break
		}
		time.Sleep(time.Until(next))
		v := count()
		out = append(out, v-last)
		last = v
	}
	time.Sleep(time.Until(end))
	return out
}
