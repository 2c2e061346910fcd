//go:build linux && amd64

package bench

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Outcome is everything one configuration gave in a benchmark.
type Outcome struct {
	Results []Result // one per round it ran
	// Skip says why it did not run at all; Failed, the error that stopped
	// it (the rounds before it stay).
	Skip, Failed string
	// Mismatches are the rounds whose counts differed from the workload's
	// own, with how; Checked, how many rounds were compared.
	Mismatches []string
	Checked    int
}

// Ratio is a per-round ratio of phase times, over the rounds both
// configurations ran: its median and range.
type Ratio struct {
	Median, Min, Max float64
	N                int
}

// Row is one configuration's line of the table.
type Row struct {
	Config           Config
	Outcome          Outcome
	Phase, Min, Max  time.Duration // the median and range of the phase
	VsUntraced       Ratio
	VsAggregate      Ratio
	VsFloor          Ratio
	CPU              time.Duration // the median of the phase's CPU time
	CPUVsUntraced    Ratio
	CPUVsFloor       Ratio
	NsPerCall        float64 // (median - untraced median) / the workload's calls
	Lost             uint64  // the most of any round
	Incomplete       int     // rounds whose report said INCOMPLETE
	HasLost, Counted bool    // whether the configuration reports losses, counts
}

// Summary is a whole benchmark's result.
type Summary struct {
	Rows []Row
}

// Summarize makes the table's rows, in the order of cfgs. Ratios pair the
// rounds: the configurations of a round ran one after another, so they
// saw the same load on the machine.
func Summarize(cfgs []Config, out map[string]Outcome) Summary {
	var s Summary
	byRound := func(key string) map[int]time.Duration {
		m := map[int]time.Duration{}
		for _, r := range out[key].Results {
			m[r.Round] = r.Phase
		}
		return m
	}
	cpuByRound := func(key string) map[int]time.Duration {
		m := map[int]time.Duration{}
		for _, r := range out[key].Results {
			m[r.Round] = r.CPU
		}
		return m
	}
	untraced := Row{}
	for _, c := range cfgs {
		o := out[c.Key]
		row := Row{Config: c, Outcome: o, HasLost: c.Kind == Hooktrace || c.Kind == Attach, Counted: c.Kind != Direct}
		if len(o.Results) > 0 {
			ph := make([]time.Duration, len(o.Results))
			cpu := make([]time.Duration, len(o.Results))
			for i, r := range o.Results {
				ph[i], cpu[i] = r.Phase, r.CPU
				row.Lost = max(row.Lost, r.Lost)
				if (c.Kind == Hooktrace || c.Kind == Attach) && !r.Complete {
					row.Incomplete++
				}
			}
			slices.Sort(ph)
			slices.Sort(cpu)
			row.Phase, row.Min, row.Max = medianOf(ph), ph[0], ph[len(ph)-1]
			row.CPU = medianOf(cpu)
			row.CPUVsUntraced = ratio(cpuByRound(c.Key), cpuByRound("untraced"))
			row.CPUVsFloor = ratio(cpuByRound(c.Key), cpuByRound("floor"))
			mine := byRound(c.Key)
			row.VsUntraced = ratio(mine, byRound("untraced"))
			row.VsAggregate = ratio(mine, byRound("aggregate"))
			row.VsFloor = ratio(mine, byRound("floor"))
			if c.Key == "untraced" {
				untraced = row
			} else if untraced.Phase > 0 {
				var calls uint64
				own := o.Results[0].Own
				for _, k := range Checked {
					if !isSyscall(k) {
						calls += own[k]
					}
				}
				if calls > 0 {
					row.NsPerCall = float64(row.Phase-untraced.Phase) / float64(calls)
				}
			}
		}
		s.Rows = append(s.Rows, row)
	}
	return s
}

func medianOf[T time.Duration | float64](sorted []T) T {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// ratio is a/b per round, over the rounds both have.
func ratio(a, b map[int]time.Duration) Ratio {
	var v []float64
	for round, x := range a {
		if y, ok := b[round]; ok && y > 0 {
			v = append(v, float64(x)/float64(y))
		}
	}
	if len(v) == 0 {
		return Ratio{}
	}
	slices.Sort(v)
	return Ratio{Median: medianOf(v), Min: v[0], Max: v[len(v)-1], N: len(v)}
}

// Row returns the row of the configuration named key, if it ran.
func (s Summary) Row(key string) (Row, bool) {
	for _, r := range s.Rows {
		if r.Config.Key == key && len(r.Outcome.Results) > 0 {
			return r, true
		}
	}
	return Row{}, false
}

func (r Ratio) String() string {
	if r.N == 0 {
		return "–"
	}
	if r.N == 1 {
		return fmtX(r.Median)
	}
	return fmt.Sprintf("%s (%s–%s)", fmtX(r.Median), fmtX(r.Min), fmtX(r.Max))
}

// fmtX prints a ratio with two significant digits or more.
func fmtX(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0fx", x)
	case x >= 10:
		return fmt.Sprintf("%.1fx", x)
	default:
		return fmt.Sprintf("%.2fx", x)
	}
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	default:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
}

// Markdown renders the table and the targets under a line that
// says what ran.
func (s Summary) Markdown(workload string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", workload)
	b.WriteString("| configuration | phase, median (range) | × untraced | × eBPF aggregate | × floor | phase CPU | CPU × untraced | CPU × floor | ns/call over untraced | lost events | counts = workload's |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	for _, r := range s.Rows {
		o := r.Outcome
		if len(o.Results) == 0 {
			why := "not run: " + o.Skip
			if o.Failed != "" {
				why = "failed: " + firstLine(o.Failed)
			}
			fmt.Fprintf(&b, "| %s | %s | | | | | | | | | |\n", r.Config.Name, why)
			continue
		}
		phase := fmtDur(r.Phase)
		if len(o.Results) > 1 {
			phase += fmt.Sprintf(" (%s–%s)", fmtDur(r.Min), fmtDur(r.Max))
		}
		perCall, lost, counts := "–", "–", "–"
		if r.Config.Key != "untraced" && r.NsPerCall != 0 {
			perCall = fmt.Sprintf("%.0f", r.NsPerCall)
		}
		if r.HasLost {
			lost = fmt.Sprint(r.Lost)
			if r.Incomplete > 0 {
				lost += fmt.Sprintf(" (%d INCOMPLETE)", r.Incomplete)
			}
		}
		if r.Counted {
			switch {
			case o.Checked == 0:
				counts = "not checked"
			case len(o.Mismatches) == 0:
				counts = fmt.Sprintf("yes (%d/%d)", o.Checked, o.Checked)
			default:
				counts = fmt.Sprintf("**no** (%d/%d): %s", o.Checked-len(o.Mismatches), o.Checked, o.Mismatches[0])
			}
		}
		vsAgg, vsFloor := r.VsAggregate.String(), r.VsFloor.String()
		if r.Config.Key == "aggregate" {
			vsAgg = "1"
		}
		if r.Config.Key == "floor" {
			vsFloor = "1"
		}
		vsUn, cpuUn, cpuFloor := r.VsUntraced.String(), r.CPUVsUntraced.String(), r.CPUVsFloor.String()
		if r.Config.Key == "untraced" {
			vsUn, vsAgg, vsFloor, cpuUn, cpuFloor = "1", "–", "–", "1", "–"
		}
		if r.Config.Key == "floor" {
			cpuFloor = "1"
		}
		if o.Failed != "" {
			counts += "; then failed: " + firstLine(o.Failed)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.Config.Name, phase, vsUn, vsAgg, vsFloor, fmtDur(r.CPU), cpuUn, cpuFloor, perCall, lost, counts)
	}
	b.WriteString("\nThe phase is the workload's own timing of its loop (start-up and attaching are outside it). " +
		"Ratios are per round (the configurations of a round ran one after another), median and range over the rounds. " +
		"Phase CPU is the workload process's user + system time in the phase (all threads, the kernel's probe handling included, " +
		"a tracer's own process not): steadier than wall time on a loaded machine. " +
		"ns/call is the median phase less the untraced median, over the workload's lock, unlock, malloc and free calls.\n")

	targets := s.Targets()
	if len(targets) == 0 {
		return b.String()
	}
	b.WriteString("\n| target | measured | met |\n|---|---:|---|\n")
	for _, t := range targets {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", t.Goal, t.Measured, yes(t.Met))
	}
	return b.String()
}

// Target is one of issues 8's and 20's goals, judged on the medians.
type Target struct {
	Goal, Measured string
	Met            bool
}

// Targets are the goals whose configurations ran.
func (s Summary) Targets() []Target {
	var ts []Target
	pre, hasPre := s.Row("preload")
	tsan, hasTSan := s.Row("tsan")
	agg, hasAgg := s.Row("aggregate")
	if hasPre {
		ts = append(ts, Target{"preload ≤ 3x untraced", pre.VsUntraced.String(), pre.VsUntraced.Median <= 3})
		if hasTSan {
			x := float64(tsan.Phase) / float64(pre.Phase)
			ts = append(ts, Target{"preload ≥ 5x faster than TSan", fmt.Sprintf("%.2fx (medians)", x), x >= 5})
		}
	}
	if att, ok := s.Row("attach-preload"); ok && len(att.Outcome.Results) > 0 {
		ts = append(ts, Target{"attach, preload injected, ≤ 3x untraced", att.VsUntraced.String(), att.VsUntraced.Median <= 3})
	}
	if hasAgg {
		if _, ok := s.Row("floor"); ok {
			ts = append(ts, Target{"eBPF aggregate ≤ 1.2x its floor", agg.VsFloor.String() + " wall, " + agg.CPUVsFloor.String() + " CPU",
				agg.VsFloor.Median <= 1.2})
		}
	}
	for _, r := range s.Rows {
		if (r.Config.Kind != Hooktrace && r.Config.Kind != Attach) || len(r.Outcome.Results) == 0 {
			continue
		}
		ts = append(ts, Target{r.Config.Name + ": 0 lost events", fmt.Sprintf("%d (worst round)", r.Lost), r.Lost == 0 && r.Incomplete == 0})
		o := r.Outcome
		ts = append(ts, Target{r.Config.Name + ": counts equal the workload's",
			fmt.Sprintf("%d of %d rounds", o.Checked-len(o.Mismatches), o.Checked), o.Checked > 0 && len(o.Mismatches) == 0})
	}
	return ts
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return strings.ReplaceAll(s, "|", "\\|")
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}
