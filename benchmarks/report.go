package main

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// markdown renders the run as one markdown document: the machine and the
// command, a pair of tables per payload, and kernrpc's ratios to each peer.
// The same text goes to the terminal and to the results file, so the tables
// are padded to line up in plain text too.
func (b *benchmark) markdown(command string) string {
	var w strings.Builder
	o := b.opts
	fmt.Fprintf(&w, "# Echo over loopback: %s\n\n", strings.Join(labels(o.systems), " vs "))
	fmt.Fprintf(&w, "Run %s UTC, took %s.\n\n", b.started.UTC().Format("2006-01-02 15:04:05"), b.finished.Sub(b.started).Round(time.Second))
	m := readMachine()
	fmt.Fprintf(&w, "- Command: `%s`\n", command)
	fmt.Fprintf(&w, "- Machine: %s; %d logical CPUs, GOMAXPROCS %d in every process\n", m.cpuModel, m.numCPU, m.gomaxprocs)
	fmt.Fprintf(&w, "- System: %s; %s\n", m.uname, m.goVersion)
	var others, elapsed time.Duration
	worstShare := 0.0
	for _, rs := range b.results {
		for _, r := range rs {
			others += r.others
			elapsed += r.elapsed
			worstShare = max(worstShare, othersShare(r.others, r.elapsed))
		}
	}
	share := othersShare(others, elapsed)
	verdict := "quiet enough"
	if share > noisyShare || worstShare > 2*noisyShare {
		verdict = "**disturbed: rerun on an idle machine before trusting differences of less than 2×**"
	}
	fmt.Fprintf(&w, "- Other processes: %.0f%% of the CPUs during the measured windows (worst cell and system %.0f%%); %s\n",
		100*share, 100*worstShare, verdict)
	fmt.Fprintf(&w, "- Method: each server in its own process, the callers in the harness process sharing one client per system; "+
		"per cell and system %d × %s measured, each after %s of warm-up, the systems taking turns round by round.\n",
		o.rounds, o.duration, o.warmup)
	w.WriteString("- Messages: one `echopb.Echo` type for all. It has vtprotobuf's generated methods, which kernrpc's protobuf codec uses " +
		"(and which let a reused reply keep its payload's memory); grpc-go's default codec encodes it through protobuf-go's reflection.\n")
	if o.server.aliasRequests {
		w.WriteString("- Non-default option: kernrpc servers decode protobuf requests in place (the codec's `alias_requests`; the echo handler only reads its request). " +
			"`-alias-requests=false` measures the default, copying decode.\n")
	}
	w.WriteString("\n")

	for _, p := range o.payloads {
		fmt.Fprintf(&w, "## %s payload\n\n", sizeName(p))
		w.WriteString("Calls/s (± half the spread between rounds) · latency mean / p50 / p99 in µs:\n\n")
		b.systemTable(&w, p, func(r *result) string {
			return fmt.Sprintf("%s ±%.0f%% · %s / %s / %s", fmtQPS(r.qps()), 100*r.spread(),
				fmtMicros(r.hist.mean()), fmtMicros(r.hist.quantile(0.5)), fmtMicros(r.hist.quantile(0.99)))
		})
		w.WriteString("Per call, client + server: heap allocations · CPU µs:\n\n")
		b.systemTable(&w, p, func(r *result) string {
			return fmt.Sprintf("%s + %s allocs · %s + %s µs",
				fmtAllocs(r.perCall(float64(r.client.mallocs))), fmtAllocs(r.perCall(float64(r.server.mallocs))),
				fmtCPU(r.perCall(micros(r.client.cpu))), fmtCPU(r.perCall(micros(r.server.cpu))))
		})
	}

	if len(b.codecs) > 0 {
		writeCodecTable(&w, b.codecs)
	}

	k := b.systemIndex("kernrpc")
	if k >= 0 {
		for i, peer := range o.systems {
			if i != k && floorOf[peer.name] == "" {
				b.ratioTable(&w, k, i)
			}
		}
	}
	for i, floor := range o.systems {
		if s := b.systemIndex(floorOf[floor.name]); s >= 0 {
			b.ratioTable(&w, s, i)
		}
	}
	return w.String()
}

// floorOf names, for each bare ping-pong, the kernrpc system over the same
// transport, which its ratio table compares with it.
var floorOf = map[string]string{"bare-tcp": "kernrpc", "bare-shm": "kernrpc-shm"}

// ratioTable writes the figures of system s divided by those of system
// peer, per cell (indexes into the run's systems).
func (b *benchmark) ratioTable(w *strings.Builder, s, peer int) {
	fmt.Fprintf(w, "## %s / %s\n\n", b.opts.systems[s].label, b.opts.systems[peer].label)
	w.WriteString("Above 1 is better for calls/s, below 1 for the rest; allocations and CPU count client + server.\n\n")
	t := table{header: []string{"payload", "callers", "calls/s", "mean", "p99", "allocs/call", "CPU/call"}}
	for _, c := range b.cells {
		kr, pr := b.results[c][s], b.results[c][peer]
		t.add(sizeName(c.payload), fmt.Sprint(c.callers),
			fmtRatio(kr.qps(), pr.qps()),
			fmtRatio(float64(kr.hist.mean()), float64(pr.hist.mean())),
			fmtRatio(float64(kr.hist.quantile(0.99)), float64(pr.hist.quantile(0.99))),
			fmtAllocRatio(kr.perCall(float64(kr.client.mallocs+kr.server.mallocs)), pr.perCall(float64(pr.client.mallocs+pr.server.mallocs))),
			fmtRatio(kr.perCall(float64(kr.client.cpu+kr.server.cpu)), pr.perCall(float64(pr.client.cpu+pr.server.cpu))))
	}
	t.write(w)
}

// systemTable writes one row per callers value and one column per system.
func (b *benchmark) systemTable(w *strings.Builder, payload int, cellText func(*result) string) {
	t := table{header: append([]string{"callers"}, labels(b.opts.systems)...)}
	for _, c := range b.cells {
		if c.payload != payload {
			continue
		}
		row := []string{fmt.Sprint(c.callers)}
		for _, r := range b.results[c] {
			row = append(row, cellText(r))
		}
		t.add(row...)
	}
	t.write(w)
}

func (b *benchmark) systemIndex(name string) int {
	for i, s := range b.opts.systems {
		if s.name == name {
			return i
		}
	}
	return -1
}

func labels(ss []*system) []string {
	var out []string
	for _, s := range ss {
		out = append(out, s.label)
	}
	return out
}

// table is a markdown table whose cells are padded so that it also reads
// as columns on a terminal. Every column but the first is right-aligned.
type table struct {
	header []string
	rows   [][]string
}

func (t *table) add(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) write(w *strings.Builder) {
	width := make([]int, len(t.header))
	for _, r := range append([][]string{t.header}, t.rows...) {
		for i, c := range r {
			width[i] = max(width[i], utf8.RuneCountInString(c), 3)
		}
	}
	line := func(cells []string) {
		w.WriteString("|")
		for i, c := range cells {
			pad := strings.Repeat(" ", width[i]-utf8.RuneCountInString(c))
			if i == 0 {
				w.WriteString(" " + c + pad + " |")
			} else {
				w.WriteString(" " + pad + c + " |")
			}
		}
		w.WriteString("\n")
	}
	line(t.header)
	w.WriteString("|")
	for i, n := range width {
		if i == 0 {
			w.WriteString(" " + strings.Repeat("-", n) + " |")
		} else {
			w.WriteString(" " + strings.Repeat("-", n-1) + ": |")
		}
	}
	w.WriteString("\n")
	for _, r := range t.rows {
		line(r)
	}
	w.WriteString("\n")
}

func fmtQPS(v float64) string {
	switch {
	case v < 1000:
		return fmt.Sprintf("%.0f", v)
	case v < 100e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	case v < 1e6:
		return fmt.Sprintf("%.0fk", v/1e3)
	}
	return fmt.Sprintf("%.2fM", v/1e6)
}

func fmtMicros(d time.Duration) string {
	us := float64(d) / float64(time.Microsecond)
	if us < 10 {
		return fmt.Sprintf("%.1f", us)
	}
	return fmt.Sprintf("%.0f", us)
}

func fmtAllocs(v float64) string {
	switch {
	case v < 0.1:
		return fmt.Sprintf("%.2f", v)
	case v < 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.0f", v)
}

func micros(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func fmtCPU(us float64) string {
	if us < 100 {
		return fmt.Sprintf("%.1f", us)
	}
	return fmt.Sprintf("%.0f", us)
}

// fmtAllocRatio is fmtRatio for allocations per call: against a peer that
// allocates almost nothing (a bare ping-pong), a ratio would only divide by
// noise.
func fmtAllocRatio(a, b float64) string {
	if b < 0.5 {
		return "n/a"
	}
	return fmtRatio(a, b)
}

// fmtRatio prints a/b, or n/a when b is zero (a peer that allocated nothing).
func fmtRatio(a, b float64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

// sizeName prints a payload size as it is written on the command line.
func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
