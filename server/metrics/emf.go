package metrics

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// Namespace is the CloudWatch namespace of every metric.
const Namespace = "Lakeshore"

// EMF is a Recorder that writes each event as one line of CloudWatch
// Embedded Metric Format to W (a Lambda's stdout): CloudWatch Logs turns
// the line into metrics, so a metric costs no PutMetricData call. Each line
// is one JSON object; lines never interleave.
type EMF struct {
	W     io.Writer
	Clock clock.Clock

	mu sync.Mutex
}

// emfMetric is one metric's definition in a line's _aws block.
type emfMetric struct {
	Name string `json:"Name"`
	Unit string `json:"Unit"`
}

// emit writes one EMF line: values (the dimension values and the metrics'
// values, by name), with metrics under dims.
func (e *EMF) emit(dims [][]string, defs []emfMetric, values map[string]any) {
	values["_aws"] = map[string]any{
		"Timestamp": e.Clock.Now().UnixMilli(),
		"CloudWatchMetrics": []map[string]any{{
			"Namespace": Namespace, "Dimensions": dims, "Metrics": defs,
		}},
	}
	b, err := json.Marshal(values)
	if err != nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = e.W.Write(append(b, '\n'))
}

func (e *EMF) Claimed(queue string, n, conflicts int, waited []time.Duration) {
	values := map[string]any{"Queue": queue, "Claims": n, "ClaimConflicts": conflicts}
	defs := []emfMetric{{"Claims", "Count"}, {"ClaimConflicts", "Count"}}
	if len(waited) > 0 {
		ms := make([]float64, 0, min(len(waited), 100)) // EMF takes at most 100 values
		for _, d := range waited[:min(len(waited), 100)] {
			ms = append(ms, float64(d.Microseconds())/1000)
		}
		values["DispatchLatency"] = ms
		defs = append(defs, emfMetric{"DispatchLatency", "Milliseconds"})
	}
	e.emit([][]string{{"Queue"}}, defs, values)
}

func (e *EMF) HandedBack(queue string, ended domain.EndKind) {
	e.emit([][]string{{"Queue"}, {"Queue", "Ended"}}, []emfMetric{{"Redeliveries", "Count"}},
		map[string]any{"Queue": queue, "Ended": string(ended), "Redeliveries": 1})
}

func (e *EMF) Finished(queue string, state domain.InvocationState) {
	e.emit([][]string{{"Queue", "State"}}, []emfMetric{{"Outcomes", "Count"}},
		map[string]any{"Queue": queue, "State": string(state), "Outcomes": 1})
}

// Gauges writes g: per queue its depth (queued), running count and oldest
// queued age; per state the number of workers and of runs (zeros too, so
// an alarm on stale workers sees 0 rather than no data).
func (e *EMF) Gauges(g Gauges) {
	for _, q := range g.Queues {
		e.emit([][]string{{"Queue"}},
			[]emfMetric{{"QueueDepth", "Count"}, {"Running", "Count"}, {"OldestQueuedAge", "Seconds"}},
			map[string]any{"Queue": q.Queue, "QueueDepth": q.Counts[domain.StateQueued],
				"Running": q.Counts[domain.StateRunning], "OldestQueuedAge": q.OldestQueuedAge.Seconds()})
	}
	for _, state := range domain.WorkerStates {
		e.emit([][]string{{"State"}}, []emfMetric{{"Workers", "Count"}},
			map[string]any{"State": string(state), "Workers": g.Workers[state]})
	}
	for _, state := range domain.RunStates {
		e.emit([][]string{{"RunState"}}, []emfMetric{{"Runs", "Count"}},
			map[string]any{"RunState": string(state), "Runs": g.Runs[state]})
	}
}

// KeyHeld writes that a provisioner pass held back the launches of a key
// of queue with queued work, after its hosts failed (stopped: it reached
// the failures in a row that stop it).
func (e *EMF) KeyHeld(queue string, stopped bool) {
	e.emit([][]string{{"Queue"}, {"Queue", "Stopped"}}, []emfMetric{{"ProvisionHeld", "Count"}},
		map[string]any{"Queue": queue, "Stopped": fmt.Sprint(stopped), "ProvisionHeld": 1})
}

// ProvisionRefused writes that the provisioner refused to launch anything
// for its configuration (why: "launch_template").
func (e *EMF) ProvisionRefused(why string) {
	e.emit([][]string{{"Reason"}}, []emfMetric{{"ProvisionRefusals", "Count"}},
		map[string]any{"Reason": why, "ProvisionRefusals": 1})
}
