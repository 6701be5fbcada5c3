package process

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/lifecycle"
	"github.com/dreamlake/lakeshore/agent/internal/process/proctest"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// warmTestHelperEnv switches the test binary into a resident body that
// speaks the runtime API (TestWarmHelperProcess); its value is the mode.
const warmTestHelperEnv = "LAKESHORE_WARM_TEST_HELPER"

// TestWarmHelperProcess is not a test: it is the resident body the warm
// tests run. Modes: "serve" serves invocations, acting on the input's
// "do"; "initfail" reports a failed host setup; "sleep" never asks;
// "exit" exits at once.
func TestWarmHelperProcess(t *testing.T) {
	mode := os.Getenv(warmTestHelperEnv)
	if mode == "" {
		return
	}
	base := os.Getenv(EnvRuntimeAPI)
	post := func(path string, body []byte) {
		resp, err := http.Post(base+path, "application/json", bytes.NewReader(body))
		if err == nil {
			resp.Body.Close()
		}
	}
	switch mode {
	case "initfail":
		post("/init/error", []byte(`{"error_type":"OSError","error_message":"checkpoint.pt not found","stack_trace":[]}`))
		os.Exit(1)
	case "sleep":
		time.Sleep(time.Hour)
	case "exit":
		os.Exit(3)
	}
	token := fmt.Sprintf("%d-%d", os.Getpid(), time.Now().UnixNano()) // "the model", loaded once
	for {
		resp, err := http.Get(base + "/next")
		if err != nil {
			fmt.Fprintln(os.Stderr, "next:", err)
			os.Exit(1)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusNoContent:
			continue
		case http.StatusGone:
			fmt.Println("shutdown hooks ran")
			os.Exit(0)
		case http.StatusOK:
		default:
			fmt.Fprintln(os.Stderr, "next answered", resp.StatusCode, string(body))
			os.Exit(1)
		}
		var task struct {
			InvocationID string            `json:"invocation_id"`
			Input        map[string]any    `json:"input"`
			Workdir      string            `json:"workdir"`
			Env          map[string]string `json:"env"`
		}
		if err := json.Unmarshal(body, &task); err != nil {
			os.Exit(1)
		}
		fmt.Println("output of", task.InvocationID)
		id := "/" + task.InvocationID
		switch task.Input["do"] {
		case "die":
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		case "hang":
			time.Sleep(time.Hour)
		case "fail":
			post(id+"/error", []byte(`{"error_type":"ValueError","error_message":"bad row 7","stack_trace":["line 1"]}`))
			continue
		case "notjson":
			post(id+"/result", []byte(`{not json`))
			continue
		case "none":
			_ = os.WriteFile(task.Env["NYMPH_RESULT_FILE"], []byte("{\"from\":\"file\"}\n"), 0o600)
			post(id+"/result", nil)
			continue
		}
		res, _ := json.Marshal(map[string]any{"model": token, "pid": os.Getpid(), "input": task.Input, "workdir": task.Workdir, "x": task.Env["LAKESHORE_MATRIX_X"]})
		post(id+"/result", res)
	}
}

// warmTestRunner is a runner with a runtime API (a real lifecycle
// server on a loopback port) and capacity warm processes.
func warmTestRunner(t *testing.T, capacity int, mods ...func(*Config)) *Runner {
	t.Helper()
	s, err := lifecycle.Listen("127.0.0.1:0", lifecycle.Config{Members: GroupMembers})
	if err != nil {
		t.Fatal(err)
	}
	r := runnerTestNew(t, func(c *Config) {
		c.Runtime = s
		c.WarmCapacity = capacity
		c.BaseEnv = append(c.BaseEnv, "GOCOVERDIR="+os.TempDir())
		for _, m := range mods {
			m(c)
		}
	})
	t.Cleanup(func() {
		r.CloseWarm(time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return r
}

// warmTestInv is a resident invocation of the helper in mode, with input.
func warmTestInv(id, mode string, input string) wire.RunInvocation {
	inv := wire.RunInvocation{InvocationID: id, Attempt: 1,
		Argv:      []string{os.Args[0], "-test.run=^TestWarmHelperProcess$"},
		RunConfig: wire.RunConfig{Resident: true, Env: map[string]string{warmTestHelperEnv: mode}}}
	if input != "" {
		inv.Input = json.RawMessage(input)
	}
	return inv
}

func warmTestResult(t *testing.T, o Outcome) map[string]any {
	t.Helper()
	if o.State != wire.StateSucceeded {
		t.Fatalf("outcome %+v, want succeeded", o)
	}
	var m map[string]any
	if err := json.Unmarshal(o.ResultBlob, &m); err != nil {
		t.Fatalf("result %q: %v", o.ResultBlob, err)
	}
	return m
}

// TestWarmServesInvocationsOnOneProcess: invocations of one run config
// and env share one warm process (its "model" loaded once), even as their
// run index and matrix cell differ; each gets its own input, env and
// workdir, and each run's stdout.log holds its own output only. Another
// run config, or another env, gets a process of its own.
func TestWarmServesInvocationsOnOneProcess(t *testing.T) {
	r := warmTestRunner(t, 2)
	var model string
	for i := range 4 {
		inv := warmTestInv(fmt.Sprintf("inv_%d", i), "serve", fmt.Sprintf(`{"n":%d}`, i))
		inv.Env = map[string]string{"LAKESHORE_RUN_INDEX": fmt.Sprint(i), "LAKESHORE_MATRIX_X": fmt.Sprint("x", i), "SHARED": "1"}
		o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
		m := warmTestResult(t, o)
		if i == 0 {
			model = m["model"].(string)
		} else if m["model"] != model {
			t.Fatalf("invocation %d ran on model %v, want the warm process's %s", i, m["model"], model)
		}
		if m["x"] != fmt.Sprint("x", i) || m["input"].(map[string]any)["n"] != float64(i) {
			t.Fatalf("invocation %d saw env X=%v input %v", i, m["x"], m["input"])
		}
		if m["workdir"] != runnerTestDir(r, inv) {
			t.Fatalf("workdir %v, want %s", m["workdir"], runnerTestDir(r, inv))
		}
		out, _ := os.ReadFile(filepath.Join(runnerTestDir(r, inv), StdoutFileName))
		if got := strings.TrimSpace(string(out)); got != "output of "+inv.InvocationID {
			t.Fatalf("invocation %d's stdout.log: %q, want its own line only", i, out)
		}
	}
	other := warmTestInv("inv_other", "serve", `{}`)
	other.RunConfig.Env["OTHER"] = "1"
	if m := warmTestResult(t, runnerTestOutcome(t, runnerTestStart(t, r, other))); m["model"] == model {
		t.Fatal("another run config was served by the first one's process")
	}
	otherEnv := warmTestInv("inv_other_env", "serve", `{}`)
	otherEnv.Env = map[string]string{"SHARED": "2"}
	if m := warmTestResult(t, runnerTestOutcome(t, runnerTestStart(t, r, otherEnv))); m["model"] == model {
		t.Fatal("an invocation of another env was served by the first one's process")
	}
	if n := r.WarmProcesses(); n != 2 {
		t.Fatalf("%d warm processes at capacity 2", n)
	}
}

// TestWarmCapacityEvictsTheIdle: at capacity, a process of a new key
// takes the place of the idle one.
func TestWarmCapacityEvictsTheIdle(t *testing.T) {
	r := warmTestRunner(t, 1)
	a := warmTestResult(t, runnerTestOutcome(t, runnerTestStart(t, r, warmTestInv("inv_a", "serve", `{}`))))
	other := warmTestInv("inv_b", "serve", `{}`)
	other.RunConfig.Env["OTHER"] = "1"
	b := warmTestResult(t, runnerTestOutcome(t, runnerTestStart(t, r, other)))
	if a["model"] == b["model"] {
		t.Fatal("two run configs shared a process")
	}
	if n := r.WarmProcesses(); n != 1 {
		t.Fatalf("%d warm processes at capacity 1", n)
	}
}

// TestWarmFailures: how each failure of a resident body ends its
// invocation, and that the pool serves the next on a process that works.
func TestWarmFailures(t *testing.T) {
	cases := []struct {
		name, mode, input string
		timeoutS          int
		abandoned         bool
		errType, errIn    string
	}{
		{name: "dies mid-body: handed back", mode: "serve", input: `{"do":"die"}`, abandoned: true, errType: ErrorTypeProcessLost, errIn: "killed by SIGKILL"},
		// A timeout that leaves the helper time to start even on a loaded
		// machine: it must be running the body when the timeout comes.
		{name: "hangs past its timeout", mode: "serve", input: `{"do":"hang"}`, timeoutS: 5, errType: ErrorTypeTimeout, errIn: "timed out"},
		{name: "the body raises", mode: "serve", input: `{"do":"fail"}`, errType: ErrorTypeBodyError, errIn: "ValueError: bad row 7"},
		{name: "a result that is not JSON", mode: "serve", input: `{"do":"notjson"}`, errType: ErrorTypeBadResult, errIn: "not one JSON value"},
		{name: "on_host_setup raises", mode: "initfail", errType: ErrorTypeHostSetupFailed, errIn: "checkpoint.pt not found"},
		{name: "never asks for an invocation", mode: "sleep", timeoutS: 1, errType: ErrorTypeStartFailed, errIn: "before it asked for an invocation"},
		{name: "exits before asking", mode: "exit", errType: ErrorTypeStartFailed, errIn: "exited with status 3 before it asked"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := warmTestRunner(t, 1)
			// A process that reports, then exits at once, races its
			// report against its exit: the report must win every time.
			tries := 1
			if c.mode == "initfail" {
				tries = 20
			}
			for i := range tries {
				inv := warmTestInv(fmt.Sprint("inv_bad_", i), c.mode, c.input)
				inv.TimeoutS = c.timeoutS
				o := runnerTestOutcome(t, runnerTestStart(t, r, inv))
				if o.State != wire.StateFailed || o.Abandoned != c.abandoned {
					t.Fatalf("outcome %+v: want failed, abandoned %v", o, c.abandoned)
				}
				runnerTestError(t, o, c.errType, c.errIn)
			}
			if c.mode != "serve" {
				return
			}
			// The next invocation is served, by a process that works.
			warmTestResult(t, runnerTestOutcome(t, runnerTestStart(t, r, warmTestInv("inv_next", "serve", `{}`))))
		})
	}
}

// TestWarmCancelKillsTheProcess: a cancel ends the body, which can only
// be by ending its process; the next invocation gets a new one.
func TestWarmCancelKillsTheProcess(t *testing.T) {
	r := warmTestRunner(t, 1)
	first := warmTestResult(t, runnerTestOutcome(t, runnerTestStart(t, r, warmTestInv("inv_1", "serve", `{}`))))
	run := runnerTestStart(t, r, warmTestInv("inv_2", "serve", `{"do":"hang"}`))
	select {
	case <-run.Started():
	case <-time.After(proctest.Wait):
		t.Fatal("the body never started")
	}
	run.Cancel()
	o := runnerTestOutcome(t, run)
	if o.State != wire.StateCancelled {
		t.Fatalf("outcome %+v, want cancelled", o)
	}
	next := warmTestResult(t, runnerTestOutcome(t, runnerTestStart(t, r, warmTestInv("inv_3", "serve", `{}`))))
	if next["model"] == first["model"] {
		t.Fatal("the cancelled invocation's process served the next one")
	}
}

// TestWarmResultFileWhenNoneIsPosted: a body that posts no result keeps
// the result file it wrote, as a plain body does.
func TestWarmResultFileWhenNoneIsPosted(t *testing.T) {
	r := warmTestRunner(t, 1)
	o := runnerTestOutcome(t, runnerTestStart(t, r, warmTestInv("inv_1", "serve", `{"do":"none"}`)))
	if o.State != wire.StateSucceeded || string(o.ResultBlob) != `{"from":"file"}` {
		t.Fatalf("outcome %+v (result %s)", o, o.ResultBlob)
	}
}

// TestWarmDrainEndsIdleProcesses: a drain tells an idle warm process to
// end (410): it runs its shutdown hooks and exits of itself.
func TestWarmDrainEndsIdleProcesses(t *testing.T) {
	r := warmTestRunner(t, 1)
	warmTestResult(t, runnerTestOutcome(t, runnerTestStart(t, r, warmTestInv("inv_1", "serve", `{}`))))
	if n := r.WarmProcesses(); n != 1 {
		t.Fatalf("%d warm processes", n)
	}
	r.DrainWarm()
	deadline := time.Now().Add(proctest.Wait)
	for r.WarmProcesses() != 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := r.WarmProcesses(); n != 0 {
		t.Fatalf("%d warm processes after the drain", n)
	}
}

// TestWarmWithoutRuntimeAPI: a resident run on a daemon without the
// runtime API fails to start, saying why.
func TestWarmWithoutRuntimeAPI(t *testing.T) {
	r := runnerTestNew(t)
	o := runnerTestOutcome(t, runnerTestStart(t, r, warmTestInv("inv_1", "serve", `{}`)))
	runnerTestError(t, o, ErrorTypeStartFailed, "runtime API")
}

// TestWarmKeepAlive: an idle warm process is kept while it is younger
// than WarmKeepAlive and told to end once it is older.
func TestWarmKeepAlive(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC))
	r := warmTestRunner(t, 1, func(c *Config) {
		c.Clock = fake.Clock()
		c.WarmKeepAlive = time.Minute
	})
	warmTestResult(t, runnerTestOutcome(t, runnerTestStart(t, r, warmTestInv("inv_1", "serve", `{}`))))
	fake.Advance(59 * time.Second)
	r.ExpireWarm()
	if n := r.WarmProcesses(); n != 1 {
		t.Fatalf("%d warm processes before the keep-alive passed, want 1", n)
	}
	fake.Advance(time.Second)
	r.ExpireWarm()
	if n := r.WarmProcesses(); n != 0 {
		t.Fatalf("%d warm processes once the keep-alive passed, want 0", n)
	}
}

// TestWarmIdleProcessDeadBeforeItTakesWork: an idle warm process that
// died (its death not yet reaped when the next invocation is handed to
// it) costs that invocation nothing: a new process serves it.
func TestWarmIdleProcessDeadBeforeItTakesWork(t *testing.T) {
	reap := make(chan struct{})
	var first atomic.Bool
	r := warmTestRunner(t, 1, func(c *Config) {
		c.Hooks.BeforeWait = func(int) {
			if first.CompareAndSwap(false, true) {
				<-reap // the first process's death stays unseen until the test says
			}
		}
	})
	t.Cleanup(func() {
		select {
		case <-reap:
		default:
			close(reap)
		}
	})
	res := warmTestResult(t, runnerTestOutcome(t, runnerTestStart(t, r, warmTestInv("inv_1", "serve", `{}`))))
	pid := int(res["pid"].(float64))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	run := runnerTestStart(t, r, warmTestInv("inv_2", "serve", `{}`))
	time.Sleep(50 * time.Millisecond) // the run offers its invocation to the dead process
	close(reap)
	second := warmTestResult(t, runnerTestOutcome(t, run))
	if second["model"] == res["model"] {
		t.Fatal("the dead process answered")
	}
}
