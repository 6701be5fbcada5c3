package tests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Dispatch scenario (docs/dispatch.md): three idle nymphs on one queue,
// invocations submitted on a fixed schedule after a few warm-ups. Latency
// is the operator's submit call (just before it is sent) to the body's
// first instruction (it writes the wall clock to a file named after its
// invocation).
const (
	dispatchWorkers = 3
	dispatchWarmups = 10
	dispatchN       = 200
	// dispatchIdle is how long the idle fleet's polls are counted: at
	// least one idle poll interval (20 s with the wake channel up).
	dispatchIdle = time.Minute
)

// BenchmarkDispatch reports dispatch latency (p50/p90/p99 ms) at one
// submit per 20 ms and per 200 ms, in process and through the Lambda
// bootstraps (`lakeshore dev --lambdas`); the requests an idle worker makes
// per minute; and the CPU seconds the control plane and the daemons spend
// per 1,000 invocations. Run it once per case: `make bench` passes
// -benchtime 1x.
func BenchmarkDispatch(b *testing.B) {
	planes := []backend{backends[0], lambdasBackend}
	for _, plane := range planes {
		for _, every := range []time.Duration{20 * time.Millisecond, 200 * time.Millisecond} {
			b.Run(fmt.Sprintf("%s/every-%s", plane.name, every), func(b *testing.B) {
				for b.Loop() {
					r := runDispatch(b, plane, every)
					b.ReportMetric(r.pct(50), "p50-ms")
					b.ReportMetric(r.pct(90), "p90-ms")
					b.ReportMetric(r.pct(99), "p99-ms")
					b.ReportMetric(r.idlePollsPerMin, "idle-polls/worker-min")
					b.ReportMetric(r.planeCPU*1000/float64(dispatchN), "plane-cpu-s/1k")
					b.ReportMetric(r.daemonCPU*1000/float64(dispatchN), "daemon-cpu-s/1k")
				}
			})
		}
	}
}

type dispatchResult struct {
	latencies           []float64 // ms, sorted
	idlePollsPerMin     float64
	planeCPU, daemonCPU float64 // seconds over the measured submits
}

// pct reports the p-th percentile latency (nearest rank).
func (r dispatchResult) pct(p int) float64 { return percentile(r.latencies, p) }

// percentile reports the p-th percentile of sorted (nearest rank; 0 when
// empty).
func percentile(sorted []float64, p int) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := (p*len(sorted)+99)/100 - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func runDispatch(b *testing.B, plane backend, every time.Duration) dispatchResult {
	b.Helper()
	d, daemons := startFleet(b, plane, 1)
	op := d.Operator()
	marks := b.TempDir()

	// Warm up (first claims, first forks), then let the fleet go idle and
	// count its polls.
	warm, _ := submitMarked(b, op, marks, dispatchWarmups, 0)
	waitMarks(b, marks, warm)
	time.Sleep(2 * time.Second)
	before := strings.Count(d.logText(), `"path":"/v1/daemon/poll"`)
	time.Sleep(dispatchIdle)
	polls := strings.Count(d.logText(), `"path":"/v1/daemon/poll"`) - before
	var res dispatchResult
	res.idlePollsPerMin = float64(polls) / dispatchWorkers / dispatchIdle.Minutes()

	planeCPU0, daemonCPU0 := groupCPU(b, d.cmd.Process.Pid), daemonsCPU(b, daemons)
	sent, _ := submitMarked(b, op, marks, dispatchN, every)
	got := waitMarks(b, marks, sent)
	res.planeCPU = groupCPU(b, d.cmd.Process.Pid) - planeCPU0
	res.daemonCPU = daemonsCPU(b, daemons) - daemonCPU0
	for id, at := range sent {
		res.latencies = append(res.latencies, float64(got[id].Sub(at).Microseconds())/1000)
	}
	slices.Sort(res.latencies)
	return res
}

// startFleet starts `lakeshore dev` on plane and dispatchWorkers idle
// nymphs, each running up to capacity bodies at once, and waits until all
// of them are active.
func startFleet(b *testing.B, plane backend, capacity int) (*devServer, []*nymphProc) {
	b.Helper()
	d := startDev(b, plane)
	op := d.Operator()
	var daemons []*nymphProc
	for i := range dispatchWorkers {
		daemons = append(daemons, startNymph(b, d, fmt.Sprintf("dispatch-%d", i), "--log-level", "info",
			"--capacity", strconv.Itoa(capacity)))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	waittest.Until(b, time.Minute, "three ready workers", func() bool {
		ws, err := op.ListWorkers(ctx, 100, "")
		if err != nil {
			return false
		}
		active := 0
		for _, w := range ws.Workers {
			if w.State == "active" {
				active++
			}
		}
		return active == dispatchWorkers
	})
	return d, daemons
}

// submitMarked submits n invocations, one every `every` (0: back to back),
// each from its own goroutine so a slow submit does not delay the next, and
// reports when each submit call began, by invocation id, and how long each
// call took (ms, sorted). Each body writes the wall clock (ns) to
// marks/<its invocation id> as its first instruction.
func submitMarked(b *testing.B, op *client.Client, marks string, n int, every time.Duration) (map[string]time.Time, []float64) {
	b.Helper()
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs []error
	var calls []float64
	out := map[string]time.Time{}
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * every)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			at := time.Now()
			inv, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"sh", "-c",
				`date +%s%N > "$0/$NYMPH_INVOCATION_ID"`, marks}})
			took := time.Since(at)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			out[inv.InvocationID] = at
			calls = append(calls, float64(took.Microseconds())/1000)
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		b.Fatalf("%d of %d submits failed; the first: %v", len(errs), n, errs[0])
	}
	slices.Sort(calls)
	return out, calls
}

// waitMarks waits until every invocation of sent has written its mark and
// reports when each body began.
func waitMarks(b *testing.B, marks string, sent map[string]time.Time) map[string]time.Time {
	b.Helper()
	got := map[string]time.Time{}
	deadline := time.Now().Add(5 * time.Minute)
	for len(got) < len(sent) {
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d bodies never started", len(sent)-len(got), len(sent))
		}
		for id := range sent {
			if _, ok := got[id]; ok {
				continue
			}
			raw, err := os.ReadFile(filepath.Join(marks, id))
			if err != nil || !strings.HasSuffix(string(raw), "\n") {
				continue // not yet, or half written
			}
			ns, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
			if err != nil {
				b.Fatalf("mark of %s: %q: %v", id, raw, err)
			}
			got[id] = time.Unix(0, ns)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return got
}

// clockTicks is the kernel's USER_HZ: /proc times are in its ticks.
const clockTicks = 100

// procCPU reads the user + system CPU seconds of process pid, and its
// process group, from /proc/<pid>/stat (0, -1 if it is gone).
func procCPU(pid int) (float64, int) {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, -1
	}
	// The command name may hold spaces: the fields start after its ')'.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	if len(f) < 13 {
		return 0, -1
	}
	pgrp, _ := strconv.Atoi(f[2])
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / clockTicks, pgrp
}

// groupCPU sums the CPU seconds of every live process in process group
// pgid: `lakeshore dev` and, with --lambdas, its emulators and bootstraps.
func groupCPU(b testing.TB, pgid int) float64 {
	b.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cpu, pgrp := procCPU(pid); pgrp == pgid {
			total += cpu
		}
	}
	return total
}

// daemonsCPU sums the CPU seconds of the nymph processes themselves (not
// their bodies).
func daemonsCPU(b *testing.B, ps []*nymphProc) float64 {
	b.Helper()
	var total float64
	for _, p := range ps {
		cpu, _ := procCPU(p.cmd.Process.Pid)
		total += cpu
	}
	return total
}
