package tests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// scrape reads url's Prometheus text into series → value (the series as
// written: name{labels}).
func scrape(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	out, err := parseMetrics(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return out
}

// parseMetrics reads Prometheus text, by series (`name{labels}` as
// written) to value.
func parseMetrics(r io.Reader) (map[string]float64, error) {
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metric line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// seriesOf returns the series of metric name in m (from parseMetrics), by
// their labels as written (`operation="Query"`; "" for none).
func seriesOf(m map[string]float64, name string) map[string]float64 {
	out := map[string]float64{}
	for series, v := range m {
		if series == name {
			out[""] = v
		} else if labels, ok := strings.CutPrefix(series, name+"{"); ok {
			out[strings.TrimSuffix(labels, "}")] = v
		}
	}
	return out
}

// emfCount sums metric name over the EMF lines in logs whose dimension
// values include want. A function's lines come with the emulator's
// "[name#n] " prefix.
func emfCount(logs, name string, want map[string]string) float64 {
	total := 0.0
	for _, line := range strings.Split(logs, "\n") {
		if !strings.Contains(line, `"_aws"`) {
			continue
		}
		var m map[string]any
		if json.Unmarshal([]byte(line[strings.IndexByte(line, '{'):]), &m) != nil {
			continue
		}
		ok := true
		for k, v := range want {
			ok = ok && m[k] == v
		}
		if n, isNum := m[name].(float64); ok && isNum {
			total += n
		}
	}
	return total
}

// TestMetrics: after real work on a real nymph, `lakeshore dev`'s /metrics
// shows the queue's depth and outcomes and the workers by state, and
// nymph's introspect /metrics its own runs. In process the counters are
// Prometheus series; through the Lambda bootstraps they are the functions'
// CloudWatch EMF lines (as on AWS), and /metrics keeps the gauges.
func TestMetrics(t *testing.T) {
	forEachPlane(t, func(t *testing.T, b backend) {
		d := startDev(t, b)
		op := d.Operator()
		introspect := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		startNymph(t, d, "m-metrics", "--capacity", "2", "--introspect-addr", introspect)
		var ids []string
		for _, script := range []string{"true", "true", "true", "exit 3"} {
			ids = append(ids, submitSh(t, op, script, 0).InvocationID)
		}
		for _, id := range ids {
			waitTerminal(t, op, id, time.Minute)
		}
		// A run on a queue nobody serves: it reads running.
		postRun(t, d, wire.RunRequest{Queue: "nobody", Argv: []string{"true"}, Jobs: []wire.RunJob{{}, {}}})

		m := scrape(t, d.URL+"/metrics")
		for series, want := range map[string]float64{
			`lakeshore_queue_invocations{queue="q",state="succeeded"}`: 3,
			`lakeshore_queue_invocations{queue="q",state="failed"}`:    1,
			`lakeshore_queue_invocations{queue="q",state="queued"}`:    0,
			`lakeshore_queue_oldest_queued_age_seconds{queue="q"}`:     0,
			`lakeshore_workers{state="active"}`:                        1,
			`lakeshore_workers{state="stale"}`:                         0,
			`lakeshore_runs{state="running"}`:                          1,
			`lakeshore_runs{state="done"}`:                             0,
		} {
			if got, ok := m[series]; !ok || got != want {
				t.Errorf("%s = %v (present %v), want %v", series, got, ok, want)
			}
		}
		if b.name == lambdasBackend.name {
			logs := d.logText()
			if got := emfCount(logs, "Outcomes", map[string]string{"Queue": "q", "State": wire.StateSucceeded}); got != 3 {
				t.Errorf("EMF Outcomes of q succeeded = %v, want 3", got)
			}
			if got := emfCount(logs, "Claims", map[string]string{"Queue": "q"}); got != 4 {
				t.Errorf("EMF Claims of q = %v, want 4", got)
			}
		} else {
			for series, want := range map[string]float64{
				`lakeshore_outcomes_total{queue="q",state="succeeded"}`: 3,
				`lakeshore_outcomes_total{queue="q",state="failed"}`:    1,
				`lakeshore_claims_total{queue="q"}`:                     4,
				`lakeshore_dispatch_latency_seconds_count{queue="q"}`:   4,
			} {
				if got := m[series]; got != want {
					t.Errorf("%s = %v, want %v", series, got, want)
				}
			}
			// Its own requests to the store, by operation: every ack is a
			// transaction, every claim a put, every poll a query or more.
			for op, least := range map[string]float64{"TransactWriteItems": 4, "PutItem": 4, "Query": 4, "GetItem": 1} {
				if got := m[`lakeshore_store_requests_total{operation="`+op+`"}`]; got < least {
					t.Errorf("lakeshore_store_requests_total of %s = %v, want at least %v", op, got, least)
				}
			}
		}

		n := scrape(t, "http://"+introspect+"/metrics")
		if n[`lakeshore_nymph_runs_finished_total{state="succeeded"}`] != 3 || n[`lakeshore_nymph_runs_finished_total{state="failed"}`] != 1 ||
			n["lakeshore_nymph_ready"] != 1 || n["lakeshore_nymph_inflight"] != 0 {
			t.Errorf("nymph /metrics: %v", n)
		}
	})
}

// postRun submits run req to d and answers what it made.
func postRun(t *testing.T, d *devServer, req wire.RunRequest) wire.RunCreated {
	t.Helper()
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	r, err := http.NewRequest(http.MethodPost, d.URL+"/v1/runs", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	r.Header.Set("Authorization", "Bearer "+d.OperatorToken)
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out wire.RunCreated
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/runs: %d %+v %v", resp.StatusCode, out, err)
	}
	return out
}
