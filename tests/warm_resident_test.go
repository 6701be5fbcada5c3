package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/pythontest"
	"github.com/dreamlake/lakeshore/shared/waittest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// warmPythonEnv is the environment a Python body of this repository
// needs: the library on its path, no bytecode written into the tree.
func warmPythonEnv(t testing.TB) map[string]string {
	t.Helper()
	pythonPath, err := filepath.Abs("../python")
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{"PYTHONPATH": pythonPath, "PYTHONDONTWRITEBYTECODE": "1"}
}

// warmScript is the absolute path of a script under the repository.
func warmScript(t testing.TB, rel string) string {
	t.Helper()
	p, err := filepath.Abs(rel)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// readLines reads path's lines (none when it does not exist).
func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(strings.TrimSpace(string(b)))
}

// TestWarmResidentLoadsOncePerProcess: a run of 50 jobs of
// examples/warm/eval.py on one nymph of capacity 2 loads the model exactly
// twice when resident (one load per warm process), and every result names
// one of those two loads; plain, the same run loads it 50 times.
func TestWarmResidentLoadsOncePerProcess(t *testing.T) {
	t.Parallel()
	pythontest.Python3(t)
	d := startDev(t, backends[0])
	startNymph(t, d, "warm-loads", "--capacity", "2")
	const jobs = 50
	for _, resident := range []bool{true, false} {
		loads := filepath.Join(t.TempDir(), "loads")
		env := warmPythonEnv(t)
		env["WARM_LOAD_S"] = "0.3"
		env["WARM_LOAD_LOG"] = loads
		req := wire.RunRequest{Queue: "q", Name: fmt.Sprint("loads resident=", resident),
			Argv: []string{"python3", warmScript(t, "../examples/warm/eval.py")}, Env: env,
			RunConfig: wire.RunConfig{Resident: resident}}
		for i := range jobs {
			req.Jobs = append(req.Jobs, wire.RunJob{Input: json.RawMessage(fmt.Sprintf(`{"prompt":%d}`, i))})
		}
		results := runToEnd(t, d, req, 3*time.Minute)
		loaded := readLines(t, loads)
		wantLoads := jobs
		if resident {
			wantLoads = 2
		}
		if len(loaded) != wantLoads {
			t.Fatalf("resident=%v: the model was loaded %d times, want %d", resident, len(loaded), wantLoads)
		}
		if len(results) != jobs {
			t.Fatalf("resident=%v: %d results, want %d", resident, len(results), jobs)
		}
		seen := map[string]int{}
		for i, r := range results {
			var got struct {
				Model string         `json:"model"`
				Input map[string]int `json:"input"`
			}
			if err := json.Unmarshal(r.Result, &got); err != nil || r.State != wire.StateSucceeded {
				t.Fatalf("resident=%v job %d: %s %s", resident, i, r.State, r.Result)
			}
			if !slices.Contains(loaded, got.Model) {
				t.Fatalf("resident=%v job %d ran on model %q, which no load made (%v)", resident, i, got.Model, loaded)
			}
			if got.Input["prompt"] != r.Index {
				t.Fatalf("resident=%v job %d got input %v", resident, r.Index, got.Input)
			}
			seen[got.Model]++
		}
		if resident && len(seen) != 2 {
			t.Fatalf("the results name %d loads, want both warm processes': %v", len(seen), seen)
		}
	}
	// A matrix run's jobs share the warm processes too, each seeing its
	// own cell (LAKESHORE_MATRIX_*, set per invocation).
	loads := filepath.Join(t.TempDir(), "loads")
	env := warmPythonEnv(t)
	env["WARM_LOAD_S"], env["WARM_LOAD_LOG"] = "0", loads
	results := runToEnd(t, d, wire.RunRequest{Queue: "q", Name: "matrix",
		Argv: []string{"python3", warmScript(t, "../examples/warm/eval.py")}, Env: env,
		RunConfig: wire.RunConfig{Resident: true}, Matrix: map[string][]string{"task": {"a", "b"}, "shard": {"0", "1", "2"}}}, time.Minute)
	cells := map[string]bool{}
	for _, r := range results {
		var got struct {
			Input map[string]string `json:"input"`
		}
		if err := json.Unmarshal(r.Result, &got); err != nil || r.State != wire.StateSucceeded {
			t.Fatalf("matrix job %d: %s %s", r.Index, r.State, r.Result)
		}
		cells[got.Input["shard"]+got.Input["task"]] = true
	}
	if len(results) != 6 || len(cells) != 6 {
		t.Fatalf("matrix results %d with %d distinct cells, want 6 and 6", len(results), len(cells))
	}
	if n := len(readLines(t, loads)); n < 1 || n > 2 {
		t.Fatalf("the matrix run loaded the model %d times, want once per warm process (1 or 2)", n)
	}
}

// warmCrashRig is a nymph of its own queue serving the crash-table body.
type warmCrashRig struct {
	d     *devServer
	op    *client.Client
	queue string
	marks string
	dir   string
	n     *nymphProc
}

func newWarmCrashRig(t *testing.T, d *devServer, name string, extra ...string) *warmCrashRig {
	t.Helper()
	r := &warmCrashRig{d: d, op: d.Operator(), queue: "warm-" + name, marks: t.TempDir(), dir: t.TempDir()}
	r.n = startNymphIn(t, d, "warm-"+name, r.dir, append([]string{"--queue", r.queue}, extra...)...)
	return r
}

// submit queues a resident job of the crash body with input.
func (r *warmCrashRig) submit(t *testing.T, input string, timeoutS int, env map[string]string) wire.Invocation {
	t.Helper()
	e := warmPythonEnv(t)
	e["WARM_MARKS"] = r.marks
	for k, v := range env {
		e[k] = v
	}
	inv, _, err := r.op.Submit(context.Background(), wire.SubmitRequest{Queue: r.queue,
		Argv:      []string{"python3", warmScript(t, "testdata/warm/crash.py")},
		RunConfig: wire.RunConfig{Resident: true, Env: e}, TimeoutS: timeoutS, Input: json.RawMessage(input)})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	return inv
}

func (r *warmCrashRig) lines(t *testing.T, name string) []string {
	return readLines(t, filepath.Join(r.marks, name))
}

// firstPid waits for the first pid in mark file name.
func (r *warmCrashRig) firstPid(t *testing.T, name string) int {
	t.Helper()
	pid := 0
	waittest.Until(t, time.Minute, "mark "+name, func() bool {
		if l := r.lines(t, name); len(l) > 0 {
			pid, _ = strconv.Atoi(l[0])
		}
		return pid > 1
	})
	return pid
}

// succeededOnceAt checks that inv succeeded at attempt, its body having
// returned exactly once (at that attempt): nothing lost, nothing twice.
func (r *warmCrashRig) succeededOnceAt(t *testing.T, inv wire.Invocation, attempt int) {
	t.Helper()
	got := waitTerminal(t, r.op, inv.InvocationID, 2*time.Minute)
	if got.State != wire.StateSucceeded || got.Attempt != attempt {
		t.Fatalf("invocation %s: %s at attempt %d (error %+v); want succeeded at attempt %d", inv.InvocationID, got.State, got.Attempt, got.Error, attempt)
	}
	if done := r.lines(t, "done-"+inv.InvocationID); !slices.Equal(done, []string{strconv.Itoa(attempt)}) {
		t.Fatalf("bodies of %s that returned: %v, want exactly attempt %d", inv.InvocationID, done, attempt)
	}
}

// TestWarmResidentCrashTable: each way a warm process can fail, with real
// nymph and real Python processes; nothing is lost and nothing counted
// twice.
func TestWarmResidentCrashTable(t *testing.T) {
	t.Parallel()
	pythontest.Python3(t)
	d := startDev(t, backends[0])

	t.Run("the warm process exits mid-body", func(t *testing.T) {
		t.Parallel()
		r := newWarmCrashRig(t, d, "exit")
		inv := r.submit(t, `{"do":"exit"}`, 0, nil)
		r.succeededOnceAt(t, inv, 2)
		if loads := r.lines(t, "loads"); len(loads) != 2 {
			t.Fatalf("on_host_setup ran %d times, want 2 (the new process runs it again)", len(loads))
		}
	})

	t.Run("the warm process is SIGKILLed mid-body", func(t *testing.T) {
		t.Parallel()
		r := newWarmCrashRig(t, d, "sigkill")
		inv := r.submit(t, `{"do":"wait-kill"}`, 0, nil)
		pid := r.firstPid(t, "pid-"+inv.InvocationID)
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		r.succeededOnceAt(t, inv, 2)
	})

	t.Run("each invocation's logs hold its own lines", func(t *testing.T) {
		t.Parallel()
		r := newWarmCrashRig(t, d, "logs")
		var invs []wire.Invocation
		for range 3 {
			inv := r.submit(t, `{}`, 0, nil)
			r.succeededOnceAt(t, inv, 1)
			invs = append(invs, inv)
		}
		if pids := r.lines(t, "loads"); len(pids) != 1 {
			t.Fatalf("%d loads: the three were not served by one warm process", len(pids))
		}
		for _, inv := range invs {
			var text string
			waittest.Until(t, time.Minute, "the logs of "+inv.InvocationID+" shipped", func() bool {
				page, err := r.op.Logs(context.Background(), inv.InvocationID, 1, 0)
				if err != nil {
					return false
				}
				text = ""
				for _, c := range page.Chunks {
					text += string(c.Data)
				}
				return page.EOF
			})
			if want := "body of " + inv.InvocationID + " attempt 1"; strings.TrimSpace(text) != want {
				t.Fatalf("logs of %s: %q, want only %q", inv.InvocationID, text, want)
			}
		}
	})

	t.Run("the body hangs past its timeout", func(t *testing.T) {
		t.Parallel()
		r := newWarmCrashRig(t, d, "hang")
		inv := r.submit(t, `{"do":"hang"}`, 5, nil) // time for the process to start even on a loaded machine
		got := waitTerminal(t, r.op, inv.InvocationID, time.Minute)
		if got.State != wire.StateFailed || got.Attempt != 1 || got.Error == nil || got.Error.Type != wire.ErrorTypeTimeout {
			t.Fatalf("invocation %+v (error %+v); want failed by timeout at attempt 1", got, got.Error)
		}
		pid := r.firstPid(t, "pid-"+inv.InvocationID)
		waittest.Until(t, 30*time.Second, "the hung process gone", func() bool { return processGone(pid) })
		next := r.submit(t, `{}`, 0, nil)
		r.succeededOnceAt(t, next, 1)
	})

	t.Run("on_host_setup raises", func(t *testing.T) {
		t.Parallel()
		r := newWarmCrashRig(t, d, "setup")
		inv := r.submit(t, `{}`, 0, map[string]string{"WARM_SETUP_FAILS": "1"})
		got := waitTerminal(t, r.op, inv.InvocationID, time.Minute)
		if got.State != wire.StateFailed || got.Error == nil || got.Error.Type != "host_setup_failed" ||
			!strings.Contains(got.Error.Message, "RuntimeError: no checkpoint at /models/missing.pt") {
			t.Fatalf("invocation %s (error %+v); want failed host_setup_failed naming the exception", got.State, got.Error)
		}
		if !strings.Contains(got.StderrTail, "Traceback") {
			t.Fatalf("the invocation's stderr holds no traceback: %q", got.StderrTail)
		}
		if done := r.lines(t, "done-"+inv.InvocationID); len(done) != 0 {
			t.Fatalf("the body ran although its host setup failed: %v", done)
		}
	})

	t.Run("nymph drains while a body runs", func(t *testing.T) {
		t.Parallel()
		r := newWarmCrashRig(t, d, "drain")
		inv := r.submit(t, `{"do":"slow","s":2}`, 0, nil)
		pid := r.firstPid(t, "pid-"+inv.InvocationID)
		if err := r.n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		if code := r.n.wait(t, time.Minute); code != 0 {
			t.Fatalf("nymph exited %d after the drain", code)
		}
		r.succeededOnceAt(t, inv, 1)
		shut := r.lines(t, "shutdown")
		if len(shut) != 2 || shut[0] != strconv.Itoa(pid) {
			t.Fatalf("on_shutdown marks %v; want one, by the warm process %d", shut, pid)
		}
		if left, err := strconv.ParseFloat(shut[1], 64); err != nil || left <= 0 {
			t.Fatalf("on_shutdown ran with %s s of the grace left; want it inside the grace", shut[1])
		}
		waittest.Until(t, 30*time.Second, "the warm process gone with nymph", func() bool { return processGone(pid) })
	})

	t.Run("nymph is SIGKILLed with warm processes up", func(t *testing.T) {
		t.Parallel()
		r := newWarmCrashRig(t, d, "nymphkill", "--capacity", "2")
		a := r.submit(t, `{"do":"orphan"}`, 0, nil)
		b := r.submit(t, `{"do":"orphan"}`, 0, map[string]string{"OTHER_CONFIG": "1"})
		orphans := []int{r.firstPid(t, "orphan-"+a.InvocationID), r.firstPid(t, "orphan-"+b.InvocationID)}
		warm := []int{r.firstPid(t, "pid-"+a.InvocationID), r.firstPid(t, "pid-"+b.InvocationID)}
		for _, pid := range orphans {
			t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
		}
		_ = r.n.cmd.Process.Signal(syscall.SIGKILL)
		r.n.wait(t, 10*time.Second)
		for _, pid := range warm {
			waittest.Until(t, 10*time.Second, "a warm process dead with its daemon (Pdeathsig)", func() bool { return processGone(pid) })
		}
		second := startNymphIn(t, d, "warm-nymphkill", r.dir, "--queue", r.queue, "--capacity", "2")
		second.waitLog(t, 30*time.Second, `"msg":"hello"`)
		for _, pid := range orphans {
			if !processGone(pid) {
				t.Fatalf("a warm process's child %d outlived the restart's hello", pid)
			}
		}
		r.succeededOnceAt(t, a, 2)
		r.succeededOnceAt(t, b, 2)
	})
}

// TestWarmRuntimeAPIIsTheProcessOwn: a warm process's runtime API answers
// its own processes only. Another invocation's body on the same nymph,
// told the URL, is refused (403), and so is a process outside any run
// (this test); the warm process itself was served (its body ran).
func TestWarmRuntimeAPIIsTheProcessOwn(t *testing.T) {
	t.Parallel()
	pythontest.Python3(t)
	d := startDev(t, backends[0])
	r := newWarmCrashRig(t, d, "own", "--capacity", "2")
	inv := r.submit(t, `{"do":"url"}`, 0, nil)
	r.succeededOnceAt(t, inv, 1)
	url := r.lines(t, "url")
	if len(url) != 1 {
		t.Fatalf("url marks %v", url)
	}
	// The warm process stays up (keep-alive): its URL still names it.
	if code := httpStatus(t, url[0]+"/lifecycle"); code != 403 {
		t.Fatalf("a process outside the run: %d, want 403", code)
	}
	out := filepath.Join(r.marks, "peeked")
	other, _, err := r.op.Submit(context.Background(), wire.SubmitRequest{Queue: r.queue, Argv: []string{"/bin/sh", "-c",
		`"$PEEK" "$U/next" > "$OUT"; "$PEEK" "$U/lifecycle" >> "$OUT"`},
		Env: map[string]string{"PEEK": bin(t, "peek"), "U": url[0], "OUT": out}})
	if err != nil {
		t.Fatal(err)
	}
	if got := waitTerminal(t, r.op, other.InvocationID, time.Minute); got.State != wire.StateSucceeded {
		t.Fatalf("the other body: %s %+v", got.State, got.Error)
	}
	if got := readLines(t, out); !slices.Equal(got, []string{"403", "403"}) {
		t.Fatalf("another invocation's body calling the runtime API: %v, want 403 403", got)
	}
}

// BenchmarkWarmStart: submit → body entered, for a body whose setup (an
// on_host_setup "model load") takes 1 s, resident (warm: the process is up
// and idle) against plain (cold: every body loads), on one idle nymph.
// nymph-ms is nymph's own share of a warm start: from the run command's
// arrival (its "run" log line) to the body entered.
func BenchmarkWarmStart(b *testing.B) {
	pythontest.Python3(b)
	d := startDev(b, backends[0])
	n := startNymph(b, d, "warm-bench")
	op := d.Operator()
	ctx := context.Background()
	env := warmPythonEnv(b)
	env["WARM_LOAD_S"] = "1"
	argv := []string{"python3", warmScript(b, "testdata/warm/bench.py")}
	// start submits one job and reports submit → entered and, from
	// nymph's log, run command → entered.
	start := func(resident bool) (total, nymph time.Duration) {
		begin := time.Now()
		inv, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: argv, RunConfig: wire.RunConfig{Resident: resident, Env: env}})
		if err != nil {
			b.Fatal(err)
		}
		var got wire.Invocation
		waittest.Until(b, time.Minute, "the job done", func() bool {
			got, err = op.GetInvocation(ctx, inv.InvocationID)
			return err == nil && wire.Terminal(got.State)
		})
		var res struct {
			Entered float64 `json:"entered"`
		}
		if err := json.Unmarshal(got.ResultBlob, &res); got.State != wire.StateSucceeded || err != nil {
			b.Fatalf("job %s: %s %s %+v", inv.InvocationID, got.State, got.ResultBlob, got.Error)
		}
		entered := time.Unix(0, int64(res.Entered*1e9))
		return entered.Sub(begin), entered.Sub(runLogTime(b, n, inv.InvocationID))
	}
	for i := 0; i < b.N; i++ {
		start(true) // the warm process starts and loads
		var warm, warmNymph, cold []time.Duration
		for range 30 {
			total, own := start(true)
			warm, warmNymph = append(warm, total), append(warmNymph, own)
		}
		for range 8 {
			total, _ := start(false)
			cold = append(cold, total)
		}
		ms := func(ds []time.Duration, q float64) float64 {
			s := slices.Clone(ds)
			slices.Sort(s)
			return float64(s[min(len(s)-1, int(q*float64(len(s))))].Microseconds()) / 1000
		}
		b.ReportMetric(ms(warm, 0.5), "warm-p50-ms")
		b.ReportMetric(ms(warm, 0.99), "warm-p99-ms")
		b.ReportMetric(ms(warmNymph, 0.5), "warm-nymph-p50-ms")
		b.ReportMetric(ms(warmNymph, 0.99), "warm-nymph-p99-ms")
		b.ReportMetric(ms(cold, 0.5), "cold-p50-ms")
		b.ReportMetric(ms(cold, 0.99), "cold-p99-ms")
		b.ReportMetric(ms(cold, 0.5)/ms(warm, 0.5), "cold/warm-p50")
	}
}

// runLogTime reads, from nymph's log, when it took the run command of id.
func runLogTime(b testing.TB, n *nymphProc, id string) time.Time {
	b.Helper()
	for _, line := range strings.Split(n.logs.String(), "\n") {
		var rec struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
			ID   string    `json:"invocation_id"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "run" && rec.ID == id {
			return rec.Time
		}
	}
	b.Fatalf("nymph logged no run of %s", id)
	return time.Time{}
}
