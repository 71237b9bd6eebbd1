package main

import (
	"context"
	"fmt"
	"time"
)

// Rounds in turn, and the progress lines that follow them.

// turnGroups splits cells, as indexes in order, into groups whose rounds
// take turns: a many-mode cell with those beside it that differ only in
// the number of client processes, every other cell alone. The report
// divides the many mode's rows by its one-client row, and the VM's speed
// drifts over minutes (one client did 23k or 45k calls/s in runs made in
// turn): rows measured round by round in turn drift alike.
func turnGroups(cells []cell) [][]int {
	var groups [][]int
	for i, c := range cells {
		if n := len(groups); n > 0 && c.mode == modeMany {
			prev := cells[groups[n-1][0]]
			if prev.mode == modeMany && prev.payload == c.payload && prev.callers == c.callers {
				groups[n-1] = append(groups[n-1], i)
				continue
			}
		}
		groups = append(groups, []int{i})
	}
	return groups
}

// runGroup runs o.rounds rounds of every system in each of group's cells
// (turnGroups): round 1 of each cell, then round 2, and so on, the systems
// taking turns within each.
func (b *benchmark) runGroup(ctx context.Context, exe string, servers []*childProcess, group []int) error {
	o := b.opts
	turns := 0
	for _, ci := range group {
		c := b.cells[ci]
		results := make([]*result, len(o.systems))
		for i, sys := range o.systems {
			if sys.streamsIn(c.mode) {
				results[i] = &result{}
				turns += o.rounds
			}
		}
		b.results[c] = results
	}
	turn, started := 0, time.Now()
	for round := 1; round <= o.rounds; round++ {
		for _, ci := range group {
			c := b.cells[ci]
			for i, sys := range o.systems {
				res := b.results[c][i]
				if res == nil {
					continue
				}
				var rr *roundResult
				var err error
				if c.mode == modeMany {
					rr, err = runManyRound(ctx, exe, sys, servers[i], c, o)
				} else {
					rr, err = runRound(ctx, sys, servers[i], c, o)
				}
				if err != nil {
					return fmt.Errorf("%s, %s, round %d: %w", sys.label, c, round, err)
				}
				res.add(rr)
				turn++
				// The group's own rounds so far say best how long its others
				// take: roundTime cannot know how long a many-mode client
				// process takes to warm (up to warmLimit).
				perRound := time.Since(started) / time.Duration(turn)
				left := estimate(b.cells[group[len(group)-1]+1:], o) + time.Duration(turns-turn)*perRound
				fmt.Fprintf(o.progress, "cell %d/%d (%s)  round %d/%d  %-16s %s  ~%s left%s\n",
					ci+1, len(b.cells), c, round, o.rounds, sys.label, progressRate(c, rr, res), left.Round(time.Second), progressNoise(c, rr, o))
			}
		}
	}
	return nil
}

// progressRate is a progress line's figures: the round's, and the cell's
// so far.
func progressRate(c cell, rr *roundResult, res *result) string {
	if c.mode == modeStream {
		return fmt.Sprintf("%8s msgs/s %7s MiB/s  (cell so far %s msgs/s)",
			fmtQPS(rr.qps()), fmtMiB(rr.qps()*float64(c.payload)/(1<<20)), fmtQPS(res.qps()))
	}
	return fmt.Sprintf("%8s calls/s  p99 %6s µs  (cell so far %s calls/s)", fmtQPS(rr.qps()), fmtMicros(rr.hist.quantile(0.99)), fmtQPS(res.qps()))
}

// progressNoise is what a progress line warns of: other processes busy,
// cold client processes, a window stretched for a first call.
func progressNoise(c cell, rr *roundResult, o options) string {
	noisy := ""
	if share := othersShare(rr.others, rr.elapsed); share > noisyShare {
		noisy = fmt.Sprintf("  other processes took %.0f%% of the CPUs!", 100*share)
	}
	if rr.cold > 0 {
		noisy += fmt.Sprintf("  %d of %d client processes were not warm within %s", rr.cold, c.clients, warmLimit(c.clients))
	}
	if rr.stretched {
		noisy += fmt.Sprintf("  no call completed in the %s window: it stayed open %s longer, until one did", o.windowOf(c), (rr.elapsed - o.windowOf(c)).Round(time.Millisecond))
	}
	return noisy
}

// roundTime is about how long one round of c takes, for progress lines
// about cells not yet started (a started group goes by its own rounds).
func roundTime(c cell, o options) time.Duration {
	d := o.warmup + o.windowOf(c) + 50*time.Millisecond
	if c.mode == modeMany {
		d += time.Duration(c.clients) * 30 * time.Millisecond // starting the client processes
	}
	return d
}

// estimate is about how long cells take with every system and round.
func estimate(cells []cell, o options) time.Duration {
	var d time.Duration
	for _, c := range cells {
		in := 0
		for _, s := range o.systems {
			if s.streamsIn(c.mode) {
				in++
			}
		}
		d += time.Duration(o.rounds*in) * roundTime(c, o)
	}
	return d
}
