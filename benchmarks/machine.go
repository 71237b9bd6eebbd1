package main

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// machine is what the results say about where they were measured.
type machine struct {
	cpuModel   string
	numCPU     int
	gomaxprocs int
	goVersion  string
	uname      string
	runtimeEnv string // the Go runtime's settings from the environment
}

func readMachine() machine {
	m := machine{
		cpuModel:   "unknown CPU",
		numCPU:     runtime.NumCPU(),
		gomaxprocs: runtime.GOMAXPROCS(0),
		goVersion:  runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		uname:      runtime.GOOS,
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpuModel = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if u := uname(); u != "" {
		m.uname = u
	}
	m.runtimeEnv = runtimeEnv(os.Getenv)
	return m
}

// runtimeEnv says which of the Go runtime's settings the environment
// sets; every process of a run (servers, client processes) inherits
// them. At 64 KiB GOGC alone moves the default path's figures by half.
func runtimeEnv(getenv func(string) string) string {
	var set []string
	for _, k := range []string{"GOGC", "GOMEMLIMIT", "GODEBUG", "GOMAXPROCS"} {
		if v := getenv(k); v != "" {
			set = append(set, k+"="+v)
		}
	}
	if len(set) == 0 {
		return "the defaults (no GOGC, GOMEMLIMIT, GODEBUG or GOMAXPROCS in the environment)"
	}
	return strings.Join(set, ", ") + ", from the environment, in every process"
}

// machineBusy is the CPU time all processes have used so far, from the
// first line of /proc/stat (user, nice, system, irq, softirq, steal), or
// false where there is no /proc. Minus the client's and the server's own
// CPU over a window, it is what other processes took: on a 2-core machine
// a compile running alongside moves the results by tens of percent, and
// this says so in the report instead of leaving it to be guessed.
func machineBusy() (time.Duration, bool) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0, false
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} { // user nice system irq softirq steal
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, false
		}
		ticks += v
	}
	const userHZ = 100 // the kernel's USER_HZ, 100 on every Linux architecture Go supports
	return time.Duration(ticks) * (time.Second / userHZ), true
}
