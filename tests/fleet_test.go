package tests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/store/embedded"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// The fleet simulator (docs/scale.md): a fleet of virtual daemons
// (fleetsim_test.go) against a real control plane, reporting dispatch
// latency, DynamoDB requests, the requests an idle worker makes, the
// control plane's CPU, and at the end the fault suite's checks.

// Where the control plane runs.
const (
	planeInProcess = "inprocess" // `lakeshore dev`, one process, over a store process of the test's (counted)
	planeDev       = "dev"       // `lakeshore dev` as it runs by default: its embedded store inside its process
	planeMoto      = "moto"      // `lakeshore dev` over moto_server
	planeLambdas   = "lambdas"   // `lakeshore dev --lambdas`: every route a real bootstrap under the emulator
)

// fleetConfig is one scenario. Each field can be overridden from the
// environment (fleetFromEnv).
type fleetConfig struct {
	plane             string
	workers, capacity int
	// rate is submits per second; 0 is an idle fleet, measured for duration.
	rate     float64
	duration time.Duration
	body     bodyDist
	// kill and bye are the fractions of the workers that, during the
	// submits, stop dead (no bye: the control plane must find them stale)
	// or drain and say bye. Each is replaced by a new machine's boot.
	kill, bye   float64
	staleAfter  time.Duration
	maxAttempts int
	// ramp spreads the workers' boots (their hellos and sockets).
	ramp              time.Duration
	lambdaConcurrency int
}

func (c fleetConfig) String() string {
	return fmt.Sprintf("plane=%s workers=%d capacity=%d rate=%g/s duration=%s body=%s kill=%g bye=%g stale_after=%s max_attempts=%d ramp=%s",
		c.plane, c.workers, c.capacity, c.rate, c.duration, c.body, c.kill, c.bye, c.staleAfter, c.maxAttempts, c.ramp)
}

// The scenarios of `make bench-fleet`.
var (
	fleetIdle = fleetConfig{plane: planeInProcess, workers: 1000, capacity: 2, duration: 5 * time.Minute,
		body: bodyDist{"exp", time.Second}, staleAfter: time.Minute, maxAttempts: 5, ramp: 2 * time.Minute}
	// churn runs the control plane as `lakeshore dev` runs by default, its
	// store inside its process; LAKESHORE_FLEET_PLANE=inprocess runs it
	// over a store process of the test's, which counts the store's side.
	fleetChurn = fleetConfig{plane: planeDev, workers: 1000, capacity: 2, rate: 200, duration: 2 * time.Minute,
		body: bodyDist{"exp", time.Second}, kill: 0.05, bye: 0.01, staleAfter: time.Minute, maxAttempts: 5, ramp: 2 * time.Minute}
	fleetLambdas = fleetConfig{plane: planeLambdas, workers: 1000, capacity: 2, rate: 20, duration: 2 * time.Minute,
		body: bodyDist{"exp", time.Second}, kill: 0.05, bye: 0.01, staleAfter: time.Minute, maxAttempts: 5,
		ramp: 2 * time.Minute, lambdaConcurrency: 32}
	fleetMoto = fleetConfig{plane: planeMoto, workers: 50, capacity: 2, rate: 5, duration: time.Minute,
		body: bodyDist{"exp", time.Second}, kill: 0.05, bye: 0.01, staleAfter: time.Minute, maxAttempts: 5, ramp: 20 * time.Second}
	// fleetSmoke is what `go test ./tests/` runs: small and short, with a
	// stale window short enough that a killed worker's work comes back
	// within the test.
	fleetSmoke = fleetConfig{plane: planeInProcess, workers: 20, capacity: 2, rate: 20, duration: 5 * time.Second,
		body: bodyDist{"exp", 100 * time.Millisecond}, kill: 0.1, bye: 0.05, staleAfter: 3 * time.Second, maxAttempts: 5,
		ramp: time.Second}
)

// fleetFromEnv overrides c's fields from LAKESHORE_FLEET_PLANE, _WORKERS,
// _CAPACITY, _RATE, _DURATION, _BODY, _KILL, _BYE, _STALE_AFTER,
// _MAX_ATTEMPTS, _RAMP and _LAMBDA_CONCURRENCY.
func fleetFromEnv(t testing.TB, c fleetConfig) fleetConfig {
	t.Helper()
	get := func(name string, parse func(string) error) {
		v := os.Getenv("LAKESHORE_FLEET_" + name)
		if v == "" {
			return
		}
		if err := parse(v); err != nil {
			t.Fatalf("LAKESHORE_FLEET_%s=%q: %v", name, v, err)
		}
	}
	atoi := func(p *int) func(string) error {
		return func(s string) (err error) { *p, err = strconv.Atoi(s); return err }
	}
	float := func(p *float64) func(string) error {
		return func(s string) (err error) { *p, err = strconv.ParseFloat(s, 64); return err }
	}
	dur := func(p *time.Duration) func(string) error {
		return func(s string) (err error) { *p, err = time.ParseDuration(s); return err }
	}
	get("PLANE", func(s string) error {
		if !slices.Contains([]string{planeInProcess, planeDev, planeMoto, planeLambdas}, s) {
			return fmt.Errorf("want %s, %s, %s or %s", planeInProcess, planeDev, planeMoto, planeLambdas)
		}
		c.plane = s
		return nil
	})
	get("WORKERS", atoi(&c.workers))
	get("CAPACITY", atoi(&c.capacity))
	get("RATE", float(&c.rate))
	get("DURATION", dur(&c.duration))
	get("BODY", func(s string) (err error) { c.body, err = parseBodyDist(s); return err })
	get("KILL", float(&c.kill))
	get("BYE", float(&c.bye))
	get("STALE_AFTER", dur(&c.staleAfter))
	get("MAX_ATTEMPTS", atoi(&c.maxAttempts))
	get("RAMP", dur(&c.ramp))
	get("LAMBDA_CONCURRENCY", atoi(&c.lambdaConcurrency))
	if c.workers < 1 || c.capacity < 1 || c.rate < 0 || c.duration <= 0 || c.kill+c.bye > 1 || c.kill < 0 || c.bye < 0 || c.maxAttempts < 3 {
		t.Fatalf("fleet scenario out of range: %s (max attempts at least 3, so killed workers' work is redelivered)", c)
	}
	return c
}

// BenchmarkFleet runs the fleet scenarios, one sub-benchmark each; run
// each once (-benchtime 1x). `make bench-fleet` runs idle, churn and
// lambdas; the LAKESHORE_FLEET_* variables change their sizes.
func BenchmarkFleet(b *testing.B) {
	for _, sc := range []struct {
		name string
		cfg  fleetConfig
	}{{"idle", fleetIdle}, {"churn", fleetChurn}, {"lambdas", fleetLambdas}, {"moto", fleetMoto}} {
		b.Run(sc.name, func(b *testing.B) {
			cfg := fleetFromEnv(b, sc.cfg)
			for b.Loop() {
				// Straight to stdout: the testing package keeps only the
				// first lines of a benchmark's log.
				r := runFleet(b, cfg, func(s string) { fmt.Print(s) })
				r.report(b)
			}
		})
	}
}

// TestFleetSmoke runs a small fleet briefly, in process, with churn: every
// invocation succeeds exactly once, whatever the killed workers held.
func TestFleetSmoke(t *testing.T) {
	r := runFleet(t, fleetSmoke, func(s string) { t.Log(s) })
	if r.submitted == 0 || r.claims < r.submitted {
		t.Fatalf("submitted %d, claims seen %d: the fleet did not run the batch", r.submitted, r.claims)
	}
}

// fleetResult is what one scenario measured.
type fleetResult struct {
	cfg fleetConfig
	// window is the measured stretch: the idle window, or the submits'.
	window time.Duration
	// bootedIn is from the first boot until the measuring began, with
	// readyAtStart of the workers ready then.
	bootedIn     time.Duration
	readyAtStart int
	drainedIn    time.Duration // from the last submit until every invocation succeeded
	submitted    int
	// latencies: dispatch latency in ms, sorted, from the invocation's
	// created_at (the control plane accepted it) to the first claim a
	// worker saw (its poll's answer).
	latencies []float64
	// waitingPoll: the latencies whose claiming poll was sent before the
	// invocation was created (a held poll, or one on its way), ms, sorted;
	// roundTrips: for the others, the claiming poll's own part, from its
	// send to its answer (the rest is the wait for a poll, woken or on
	// its clock).
	waitingPoll, roundTrips []float64
	// firstUnseen counts invocations whose attempt 1 no worker saw: the
	// answer was in flight when its worker was killed.
	firstUnseen int
	claims      int
	// daemonReqs and dynamo count over window; dynamoAll and failedWrites
	// from the first submit until drained.
	daemonReqs   [reqKinds]int64
	dynamo       map[string]int
	dynamoAll    map[string]int
	failedWrites map[string]int
	// failedByTable: the refused single-item writes by operation and table.
	failedByTable map[string]int
	// byTarget: every request by operation, table and index.
	byTarget map[string]int
	// storeBusyMS and storeBytes: the store's time serving each operation
	// and the bytes it answered, first submit to drained.
	storeBusyMS, storeBytes map[string]int
	// storeConns: the connections the store accepted over the window.
	storeConns int64
	// planeCPU is the control plane's process group (`lakeshore dev`, and
	// with --lambdas its emulators and bootstraps) over window; storeCPU
	// the store process's (minidyn, or the proxy to moto: not moto
	// itself); simCPU this process's (the virtual daemons).
	planeCPU, storeCPU, simCPU float64
	// From the control plane's /metrics (in process only; -1 when absent).
	metricClaims, metricConflicts float64
	outcomes
	// ackedTwice counts invocations with more than one recorded outcome,
	// as the workers' acks were answered; notSucceeded those with none,
	// and cutOff those whose only succeeded ack was on its way when its
	// worker was killed (the store's check says whether it counted).
	ackedTwice, notSucceeded, cutOff int
	letGo, failures                  int64
	killed, byes                     int
}

func (r fleetResult) pct(p int) float64 {
	return dispatchResult{latencies: r.latencies}.pct(p)
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// perIdleWorkerHour is the requests each worker made per hour of the idle
// window.
func (r fleetResult) perIdleWorkerHour(n float64) float64 {
	return n / float64(r.cfg.workers) / r.window.Hours()
}

func (r fleetResult) daemonTotal() int64 {
	var n int64
	for _, v := range r.daemonReqs {
		n += v
	}
	return n
}

// report sets the benchmark's metrics and fails it on a broken invariant.
func (r fleetResult) report(b *testing.B) {
	if r.cfg.rate == 0 {
		b.ReportMetric(r.perIdleWorkerHour(float64(r.daemonTotal())), "req/idle-worker-h")
		b.ReportMetric(r.perIdleWorkerHour(float64(sum(r.dynamo))), "dynamo-req/idle-worker-h")
	} else {
		b.ReportMetric(r.pct(50), "p50-ms")
		b.ReportMetric(r.pct(99), "p99-ms")
		failed := float64(r.failedWrites["PutItem"]) / max(float64(r.claims), 1)
		if r.cfg.plane == planeDev {
			// No store process counts failed writes: the plane's lost claim
			// races are its failed claim puts.
			failed = r.metricConflicts / max(r.metricClaims, 1)
		}
		b.ReportMetric(failed, "failed-puts/claim")
		b.ReportMetric(float64(r.lost), "lost")
		b.ReportMetric(float64(r.doubleCounted+r.ackedTwice), "double")
	}
	b.ReportMetric(float64(sum(r.dynamo))/r.window.Seconds(), "dynamo-req/s")
	b.ReportMetric(r.planeCPU, "plane-cpu-s")
	b.ReportMetric(r.storeCPU, "store-cpu-s")
}

// table is the human report: every figure, and the requests by kind.
func (r fleetResult) table() string {
	var s strings.Builder
	fmt.Fprintf(&s, "\n%s\n", r.cfg)
	fmt.Fprintf(&s, "%d of %d workers ready %s after the first boot; window %s", r.readyAtStart, r.cfg.workers,
		r.bootedIn.Round(time.Second), r.window.Round(time.Millisecond))
	if r.cfg.rate > 0 {
		fmt.Fprintf(&s, ", %d submitted, drained %s after the last submit, %d claims seen, %d killed, %d said bye",
			r.submitted, r.drainedIn.Round(time.Millisecond), r.claims, r.killed, r.byes)
	}
	fmt.Fprintf(&s, "\n")
	if r.cfg.rate > 0 {
		fmt.Fprintf(&s, "dispatch (created_at -> claim seen): p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms over %d (%d first attempts unseen)\n",
			r.pct(50), r.pct(90), r.pct(99), r.pct(100), len(r.latencies), r.firstUnseen)
		fmt.Fprintf(&s, "  claimed by a poll already waiting when it was created: %d, dispatch %s\n", len(r.waitingPoll), pcts(r.waitingPoll))
		fmt.Fprintf(&s, "  claimed by a poll sent after: %d, that poll's round trip (sent -> answered) %s\n", len(r.roundTrips), pcts(r.roundTrips))
	}
	secs := r.window.Seconds()
	fmt.Fprintf(&s, "daemon requests over the window: %d (%.1f/s):", r.daemonTotal(), float64(r.daemonTotal())/secs)
	for i, n := range r.daemonReqs {
		fmt.Fprintf(&s, " %s %d", reqKindNames[i], n)
	}
	fmt.Fprintf(&s, "\nDynamoDB requests per daemon request %.2f over the window", float64(sum(r.dynamo))/float64(max(r.daemonTotal(), 1)))
	fmt.Fprintf(&s, "\nDynamoDB requests over the window: %d (%.1f/s):", sum(r.dynamo), float64(sum(r.dynamo))/secs)
	for _, op := range slices.Sorted(maps.Keys(r.dynamo)) {
		fmt.Fprintf(&s, " %s %.1f/s", op, float64(r.dynamo[op])/secs)
	}
	fmt.Fprintf(&s, "\n")
	if r.cfg.rate == 0 {
		fmt.Fprintf(&s, "per idle worker per hour: %.0f daemon requests, %.0f DynamoDB requests\n",
			r.perIdleWorkerHour(float64(r.daemonTotal())), r.perIdleWorkerHour(float64(sum(r.dynamo))))
	} else {
		fmt.Fprintf(&s, "DynamoDB requests per invocation, first submit to drained: %.2f", float64(sum(r.dynamoAll))/float64(max(r.submitted, 1)))
		if r.cfg.plane != planeDev {
			r.failedWritesLine(&s)
		}
		if r.metricClaims >= 0 {
			fmt.Fprintf(&s, "; /metrics: %.0f claims, %.0f claim conflicts (%.3f per claim)", r.metricClaims, r.metricConflicts,
				r.metricConflicts/max(r.metricClaims, 1))
		}
		fmt.Fprintf(&s, "\n")
	}
	if r.cfg.plane == planeDev {
		fmt.Fprintf(&s, "store: the control plane's own, in its process (its CPU is the plane's; requests by operation from the plane's /metrics; failed writes, tables, time and connections not counted)\n")
	} else {
		r.storeLines(&s)
	}
	fmt.Fprintf(&s, "CPU over the window: control plane %.1f s (%.0f%% of a core), store %.1f s (%.0f%%), simulator %.1f s (%.0f%%)\n",
		r.planeCPU, 100*r.planeCPU/secs, r.storeCPU, 100*r.storeCPU/secs, r.simCPU, 100*r.simCPU/secs)
	fmt.Fprintf(&s, "workers let go while alive %d, failed requests %d\n", r.letGo, r.failures)
	return s.String()
}

// failedWritesLine adds the conditional writes the store refused, by
// operation and table.
func (r fleetResult) failedWritesLine(s *strings.Builder) {
	fmt.Fprintf(s, "; failed conditional writes:")
	for _, op := range slices.Sorted(maps.Keys(r.failedWrites)) {
		fmt.Fprintf(s, " %s %d", op, r.failedWrites[op])
	}
	fmt.Fprintf(s, " (%.3f failed PutItem per claim); by table:", float64(r.failedWrites["PutItem"])/float64(max(r.claims, 1)))
	for _, k := range slices.Sorted(maps.Keys(r.failedByTable)) {
		fmt.Fprintf(s, " %s %d", k, r.failedByTable[k])
	}
}

// storeLines adds what the store process counted: its time and answers by
// operation, its requests by table and index, its connections.
func (r fleetResult) storeLines(s *strings.Builder) {
	fmt.Fprintf(s, "store, by operation (requests, ms serving them, KB answered; over the window, or first submit to drained):")
	for _, op := range slices.Sorted(maps.Keys(r.dynamoAll)) {
		fmt.Fprintf(s, " %s %d/%d ms/%d KB", op, r.dynamoAll[op], r.storeBusyMS[op], r.storeBytes[op]>>10)
	}
	fmt.Fprintf(s, "\nstore, by table and index (requests; the same span):")
	for _, k := range slices.Sorted(maps.Keys(r.byTarget)) {
		fmt.Fprintf(s, " %s %d;", k, r.byTarget[k])
	}
	fmt.Fprintf(s, "\nconnections the store accepted over the window: %d\n", r.storeConns)
}

// pcts is the p50, p90, p99 and max of sorted ms figures.
func pcts(ms []float64) string {
	return fmt.Sprintf("p50 %.1f ms, p90 %.1f ms, p99 %.1f ms, max %.1f ms", percentile(ms, 50), percentile(ms, 90), percentile(ms, 99), percentile(ms, 100))
}

// drained reports whether every one of ids has succeeded as the fleet
// heard it: a succeeded ack answered recorded, or, for one whose succeeded
// ack was cut off by its worker's kill, the invocation succeeded as the
// control plane reads it (the kill may have come after the write).
func drained(op *client.Client, f *fleet, ids []string) bool {
	n, cut := f.heard(ids)
	if n+len(cut) < len(ids) {
		return false
	}
	for _, id := range cut {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		inv, err := op.GetInvocation(ctx, id)
		cancel()
		if err != nil || inv.State != wire.StateSucceeded {
			return false
		}
	}
	return true
}

// checks is the line of the fault suite's checks.
func (r fleetResult) checks() string {
	return fmt.Sprintf("checks: %d invocations, %d succeeded, lost %d (wrongly cancelled %d), double-counted %d, bad history %d %v, redelivered %d; "+
		"acks recorded twice %d, never a recorded success %d, a success acked by a worker killed before it heard %d\n",
		r.invocations, r.succeeded, r.lost, r.wronglyCancelled, r.doubleCounted, r.badHistory, r.badHistoryNotes, r.redelivered,
		r.ackedTwice, r.notSucceeded, r.cutOff)
}

// raiseNoFile lifts the soft limit on open files to the hard one: a
// thousand sockets and long polls each side (`lakeshore dev` inherits it).
func raiseNoFile(t testing.TB, need uint64) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatalf("getrlimit: %v", err)
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatalf("setrlimit: %v", err)
		}
	}
	if lim.Cur < need {
		t.Fatalf("open files limited to %d; this fleet needs about %d (raise ulimit -n)", lim.Cur, need)
	}
}

// fleetStoreEnv, set, makes the test binary the fleet's DynamoDB endpoint
// (serveFleetStore) instead of running tests; its value is the upstream:
// "embedded", or the URL of moto_server.
const fleetStoreEnv = "LAKESHORE_FLEET_STORE"

// serveFleetStore serves the fleet's DynamoDB endpoint on loopback and
// prints its URL: the embedded store (minidyn, as `lakeshore dev` embeds
// it) or a proxy to moto_server, counting every request (dynamoCounts). It
// runs until its parent closes its stdin, and reports the exit code.
func serveFleetStore(upstreamURL string) int {
	var upstream http.Handler = embedded.Handler()
	if upstreamURL != "embedded" {
		u, err := url.Parse(upstreamURL)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleet store:", err)
			return 2
		}
		upstream = httputil.NewSingleHostReverseProxy(u)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "fleet store:", err)
		return 2
	}
	if path := os.Getenv(fleetStoreProfileEnv); path != "" {
		f, err := os.Create(path)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "fleet store: profile:", err)
			return 2
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
		runtime.SetMutexProfileFraction(5)
		runtime.SetBlockProfileRate(100000)
		defer func() {
			for _, name := range []string{"mutex", "block"} {
				if g, err := os.Create(path + "." + name); err == nil {
					_ = pprof.Lookup(name).WriteTo(g, 0)
					_ = g.Close()
				}
			}
		}()
	}
	counts := &dynamoCounts{}
	srv := &http.Server{Handler: counts.wrap(upstream), ConnState: counts.countConn, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	fmt.Printf("LAKESHORE_FLEET_STORE_URL=http://%s\n", ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = srv.Close()
	return 0
}

// fleetStoreProfileEnv, set to a path, has the store process write its CPU
// profile there, and its mutex and block profiles beside it (the path
// with ".mutex" and ".block"; go tool pprof reads them): where the store's
// time goes under a fleet, and where its requests wait for one another.
const fleetStoreProfileEnv = "LAKESHORE_FLEET_STORE_PROFILE"

// fleetStore is the store process: this test binary re-run as the fleet's
// DynamoDB endpoint, so the store's CPU and garbage are its own, neither
// the control plane's nor the simulator's.
type fleetStore struct {
	url string
	pid int
	// plane is the control plane's URL, whose /metrics counts the store
	// requests when the store is its own (url and pid unset: planeDev).
	plane string
}

func startFleetStore(t testing.TB, upstream string) fleetStore {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fleetStoreEnv+"="+upstream)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the fleet store: %v", err)
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	u, ok := strings.CutPrefix(strings.TrimSpace(line), "LAKESHORE_FLEET_STORE_URL=")
	if err != nil || !ok {
		t.Fatalf("the fleet store did not say where it listens: %q, %v", line, err)
	}
	return fleetStore{url: u, pid: cmd.Process.Pid}
}

// counts reads the store's counts so far.
func (s fleetStore) counts(t testing.TB) storeCounts {
	t.Helper()
	var c storeCounts
	if s.url == "" {
		// The store is the control plane's own (planeDev): its requests by
		// operation are on the plane's /metrics; the rest is not counted.
		c.Requests = map[string]int{}
		for labels, v := range seriesOf(scrapeMetrics(s.plane), "lakeshore_store_requests_total") {
			op := strings.TrimSuffix(strings.TrimPrefix(labels, `operation="`), `"`)
			c.Requests[op] += int(v)
		}
		return c
	}
	resp, err := http.Get(s.url + countsPath)
	if err == nil {
		defer resp.Body.Close()
		err = json.NewDecoder(resp.Body).Decode(&c)
	}
	if err != nil {
		t.Fatalf("fleet store counts: %v", err)
	}
	return c
}

// startFleetPlane starts `lakeshore dev` for cfg.plane over the fleet
// store (startFleetStore): `--store aws` points the control plane, and
// with --lambdas every bootstrap, at it.
func startFleetPlane(t testing.TB, cfg fleetConfig) (*devServer, fleetStore) {
	t.Helper()
	args := []string{"--table-prefix", storetest.Prefix(t), "--host-poll-interval", "0",
		"--artifacts-dir", t.TempDir(), "--stale-after", cfg.staleAfter.String(), "--log-level", "warn"}
	if cfg.plane == planeDev {
		d := startDev(t, backend{cfg.plane, func(testing.TB) ([]string, []string) { return args, nil }})
		return d, fleetStore{plane: d.URL}
	}
	upstream := "embedded"
	if cfg.plane == planeMoto {
		upstream = storetest.MotoEndpoint(t)
	}
	store := startFleetStore(t, upstream)
	args = append(args, "--store", "aws")
	if cfg.plane == planeLambdas {
		rieBin(t)
		// The emulator's reports and the functions' lines are what shows
		// the Lambda path ran (startDev checks): info.
		args = append(args, "--lambdas", lambdaDist(t), "--lambda-concurrency", strconv.Itoa(max(cfg.lambdaConcurrency, 1)),
			"--log-level", "info")
	}
	env := []string{"AWS_ENDPOINT_URL=" + store.url, "AWS_REGION=" + storetest.Region, "AWS_ACCESS_KEY_ID=test",
		"AWS_SECRET_ACCESS_KEY=test", "AWS_SESSION_TOKEN=", "AWS_PROFILE=", "AWS_EC2_METADATA_DISABLED=true"}
	return startDev(t, backend{cfg.plane, func(testing.TB) ([]string, []string) { return args, env }}), store
}

// selfCPU reports this process's user + system CPU seconds.
func selfCPU(t testing.TB) float64 {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// scrapeClaims reads the claims and claim conflicts the control plane's
// /metrics counted (-1, -1 when it serves none).
func scrapeClaims(d *devServer) (claims, conflicts float64) {
	m := scrapeMetrics(d.URL)
	sumOf := func(name string) float64 {
		series := seriesOf(m, name)
		if len(series) == 0 {
			return -1
		}
		total := 0.0
		for _, v := range series {
			total += v
		}
		return total
	}
	return sumOf("lakeshore_claims_total"), sumOf("lakeshore_claim_conflicts_total")
}

// scrapeMetrics reads the control plane at url's /metrics, by series (nil
// when it serves none; parseMetrics).
func scrapeMetrics(url string) map[string]float64 {
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	m, err := parseMetrics(resp.Body)
	if err != nil {
		return nil
	}
	return m
}

// runFleet runs one scenario from the control plane's start to the checks,
// showing the figures before the checks (a batch of many thousands takes
// a while to read back) and the checks' line after them.
func runFleet(t testing.TB, cfg fleetConfig, show func(string)) fleetResult {
	t.Helper()
	raiseNoFile(t, uint64(cfg.workers)*4+1024)
	d, store := startFleetPlane(t, cfg)
	op := d.Operator()
	ctx, cancel := context.WithCancel(context.Background())
	f := newFleet(d.URL, d.EnrollToken, "fleet", cfg.capacity, cfg.body)
	stopped := false
	stopFleet := func() {
		if !stopped {
			stopped = true
			cancel()
			f.wg.Wait()
		}
	}
	t.Cleanup(stopFleet) // before the control plane stops (cleanups run last first)

	bootStart := time.Now()
	for range cfg.workers {
		if !sleepCtx(ctx, cfg.ramp/time.Duration(cfg.workers)) {
			break
		}
		f.boot(ctx)
	}
	// A fleet the control plane cannot take in is a finding, not a
	// setup failure: go on with the workers that are ready, and say so.
	readyBy := time.Now().Add(2 * time.Minute)
	for f.readyCount() < cfg.workers && time.Now().Before(readyBy) {
		time.Sleep(100 * time.Millisecond)
	}
	if n := f.readyCount(); n < cfg.workers {
		t.Errorf("%d of %d workers ready 2m after the last boot", n, cfg.workers)
	}
	// Let the boots' first polls and sockets settle into the idle cadence.
	time.Sleep(min(time.Duration(float64(cfg.staleAfter)/3*1.2), 25*time.Second))

	r := fleetResult{cfg: cfg, metricClaims: -1, metricConflicts: -1, bootedIn: time.Since(bootStart), readyAtStart: f.readyCount()}
	reqs0, counts0 := f.reqs.snapshot(), store.counts(t)
	plane0, self0 := groupCPU(t, d.cmd.Process.Pid), selfCPU(t)
	store0, _ := procCPU(store.pid)
	claims0, conflicts0 := scrapeClaims(d)
	start := time.Now()
	var sent map[string]time.Time
	if cfg.rate == 0 {
		time.Sleep(cfg.duration)
	} else {
		var churned sync.WaitGroup
		churned.Go(func() { r.killed, r.byes = churn(ctx, f, cfg) })
		sent = submitFleet(t, op, f.queue, cfg)
		churned.Wait()
	}
	r.window = time.Since(start)
	reqs1, counts1 := f.reqs.snapshot(), store.counts(t)
	r.planeCPU, r.simCPU = groupCPU(t, d.cmd.Process.Pid)-plane0, selfCPU(t)-self0
	store1, _ := procCPU(store.pid)
	r.storeCPU = store1 - store0
	for i := range reqs1 {
		r.daemonReqs[i] = reqs1[i] - reqs0[i]
	}
	r.dynamo = diffCounts(counts1.Requests, counts0.Requests)
	r.dynamoAll, r.failedWrites = r.dynamo, diffCounts(counts1.FailedWrites, counts0.FailedWrites)
	r.failedByTable = diffCounts(counts1.FailedByTable, counts0.FailedByTable)
	r.byTarget = diffCounts(counts1.ByTarget, counts0.ByTarget)
	r.storeBusyMS, r.storeBytes = diffCounts(counts1.BusyMS, counts0.BusyMS), diffCounts(counts1.BytesOut, counts0.BytesOut)
	r.storeConns = counts1.Connections - counts0.Connections
	if cfg.rate > 0 {
		r.submitted = len(sent)
		drainStart := time.Now()
		limit := 2*cfg.staleAfter + 2*time.Minute
		ids := slices.Collect(maps.Keys(sent))
		for !drained(op, f, ids) && time.Since(drainStart) < limit {
			time.Sleep(100 * time.Millisecond)
		}
		r.drainedIn = time.Since(drainStart)
		if n, cut := f.heard(ids); n+len(cut) < len(ids) {
			// Still report: the figures say where the time went.
			t.Errorf("%d of %d invocations succeeded %s after the last submit (%d more acked by a worker killed before it heard)", n, len(ids), limit, len(cut))
		}
		counts2 := store.counts(t)
		r.dynamoAll = diffCounts(counts2.Requests, counts0.Requests)
		r.failedWrites = diffCounts(counts2.FailedWrites, counts0.FailedWrites)
		r.failedByTable = diffCounts(counts2.FailedByTable, counts0.FailedByTable)
		r.byTarget = diffCounts(counts2.ByTarget, counts0.ByTarget)
		r.storeBusyMS = diffCounts(counts2.BusyMS, counts0.BusyMS)
		r.storeBytes = diffCounts(counts2.BytesOut, counts0.BytesOut)
		if c, k := scrapeClaims(d); c >= 0 {
			r.metricClaims, r.metricConflicts = c-max(claims0, 0), max(k, 0)-max(conflicts0, 0)
		}
	}
	stopFleet()
	r.letGo, r.failures = f.letGo.Load(), f.failures.Load()
	f.mu.Lock()
	for _, cs := range f.claims {
		r.claims += len(cs)
	}
	for id, created := range sent {
		cs := f.claims[id]
		i := slices.IndexFunc(cs, func(c claimSeen) bool { return c.attempt == 1 })
		if i < 0 {
			r.firstUnseen++
			continue
		}
		r.latencies = append(r.latencies, float64(cs[i].at.Sub(created).Microseconds())/1000)
		if cs[i].sent.Before(created) {
			r.waitingPoll = append(r.waitingPoll, r.latencies[len(r.latencies)-1])
		} else {
			r.roundTrips = append(r.roundTrips, float64(cs[i].at.Sub(cs[i].sent).Microseconds())/1000)
		}
		n := 0
		for _, a := range f.answered[id] {
			if a.recorded {
				n++
			}
		}
		switch {
		case n > 1:
			r.ackedTwice++
		case heardSuccess(f.answered[id]):
		case f.cutOff[id]:
			// Its worker was killed with the ack on its way; the store's
			// check (outcomes) says whether it was recorded.
			r.cutOff++
		default:
			r.notSucceeded++
		}
	}
	f.mu.Unlock()
	slices.Sort(r.latencies)
	slices.Sort(r.roundTrips)
	slices.Sort(r.waitingPoll)
	show(r.table())
	if cfg.rate > 0 {
		r.outcomes = checkOutcomes(t, op, f.queue, slices.Collect(maps.Keys(sent)), 8)
		show(r.checks())
		if r.lost != 0 || r.doubleCounted != 0 || r.badHistory != 0 || r.ackedTwice != 0 || r.notSucceeded != 0 || r.succeeded != r.invocations {
			t.Errorf("fleet: %d of %d succeeded; lost %d (wrongly cancelled %d), double-counted %d, bad history %d %v, acks recorded twice %d, no recorded success %d; want every one succeeded, the rest 0",
				r.succeeded, r.invocations, r.lost, r.wronglyCancelled, r.doubleCounted, r.badHistory, r.badHistoryNotes, r.ackedTwice, r.notSucceeded)
		}
	}
	return r
}

func diffCounts(now, before map[string]int) map[string]int {
	out := map[string]int{}
	for k, v := range now {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// churn kills and byes workers at random moments in the first 60 % of the
// submits (after the first 10 %), each replaced a second later by a new
// machine's boot, and reports how many it stopped each way.
func churn(ctx context.Context, f *fleet, cfg fleetConfig) (killed, byes int) {
	type event struct {
		at   time.Duration
		kind stopKind
	}
	var evs []event
	add := func(n int, k stopKind) {
		for range n {
			evs = append(evs, event{time.Duration((0.1 + 0.5*rand.Float64()) * float64(cfg.duration)), k})
		}
	}
	add(int(math.Round(cfg.kill*float64(cfg.workers))), stopKill)
	add(int(math.Round(cfg.bye*float64(cfg.workers))), stopBye)
	slices.SortFunc(evs, func(a, b event) int { return int(a.at - b.at) })
	start := time.Now()
	for _, e := range evs {
		if !sleepCtx(ctx, time.Until(start.Add(e.at))) {
			return
		}
		w := f.pick()
		if w == nil {
			continue
		}
		w.stop(e.kind)
		if e.kind == stopKill {
			killed++
		} else {
			byes++
		}
		time.AfterFunc(time.Second, func() {
			if ctx.Err() == nil {
				f.boot(ctx)
			}
		})
	}
	return
}

// submitFleet submits at cfg.rate for cfg.duration through the operator
// API, each submit from its own goroutine (at most 256 at once) so a slow
// one does not delay the schedule; a retryable failure is retried with the
// same idempotency key. It reports each invocation's created_at by id.
func submitFleet(t testing.TB, op *client.Client, queue string, cfg fleetConfig) map[string]time.Time {
	t.Helper()
	n := int(cfg.rate * cfg.duration.Seconds())
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs []error
	out := make(map[string]time.Time, n)
	sem := make(chan struct{}, 256)
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(float64(i) / cfg.rate * float64(time.Second)))))
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			req := wire.SubmitRequest{Queue: queue, Argv: []string{"sleep"}, MaxAttempts: cfg.maxAttempts,
				IdempotencyKey: fmt.Sprintf("fleet-%d", i)}
			var inv wire.Invocation
			var err error
			for attempt := range 5 {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				inv, _, err = op.Submit(ctx, req)
				cancel()
				if err == nil || !client.Retryable(err) {
					break
				}
				time.Sleep(200 * time.Millisecond << attempt)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			out[inv.InvocationID] = inv.CreatedAt
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d submits failed; the first: %v", len(errs), n, errs[0])
	}
	return out
}

// TestFleetCountsCutOffAcks: an invocation whose only succeeded ack was on
// its way when its worker was killed is neither heard nor missing: the
// drain waits on the store for it, not on an answer nobody is left to hear.
func TestFleetCountsCutOffAcks(t *testing.T) {
	f := newFleet("http://127.0.0.1:1", "", "q", 1, bodyDist{})
	f.ackAnswered("heard", ackSeen{attempt: 1, state: wire.StateSucceeded, recorded: true})
	f.ackAnswered("refused", ackSeen{attempt: 1, state: wire.StateSucceeded, recorded: false})
	f.ackCutOff("cut")
	f.ackCutOff("cut-then-heard")
	f.ackAnswered("cut-then-heard", ackSeen{attempt: 2, state: wire.StateSucceeded, recorded: true})
	n, cut := f.heard([]string{"heard", "refused", "cut", "cut-then-heard", "silent"})
	if n != 2 || !slices.Equal(cut, []string{"cut"}) {
		t.Fatalf("heard = %d, cut off %v; want 2 and [cut]", n, cut)
	}
}
