// Package prom serves the control plane's metrics (server/metrics) as
// Prometheus text: `lakeshore dev`'s /metrics. It is its own package so the
// Lambdas, which write CloudWatch EMF lines instead, never link the
// Prometheus client.
package prom

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/dreamlake/lakeshore/server/metrics"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// gaugeTimeout bounds the store reads of one scrape.
const gaugeTimeout = 10 * time.Second

// Prometheus is a Recorder that serves what it counted, and the gauges read
// at each scrape, as Prometheus text.
type Prometheus struct {
	reg        *prometheus.Registry
	claims     *prometheus.CounterVec
	conflicts  *prometheus.CounterVec
	handedBack *prometheus.CounterVec
	finished   *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	held       *prometheus.CounterVec
	refused    *prometheus.CounterVec
	requests   *prometheus.CounterVec
}

var _ metrics.Provision = (*Prometheus)(nil)

// New returns a recorder whose Handler also reports gauges, read
// by read at every scrape (nil: no gauges).
func New(read func(context.Context) (metrics.Gauges, error), log *slog.Logger) *Prometheus {
	p := &Prometheus{
		reg: prometheus.NewRegistry(),
		claims: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lakeshore_claims_total", Help: "Invocations claimed by workers' polls.",
		}, []string{"queue"}),
		conflicts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lakeshore_claim_conflicts_total", Help: "Claim races lost: conditional writes wasted on an invocation another poll took first.",
		}, []string{"queue"}),
		handedBack: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lakeshore_redeliveries_total", Help: "Attempts taken back from their worker, by how they ended (stale, gone, bye, omitted).",
		}, []string{"queue", "ended"}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lakeshore_outcomes_total", Help: "Invocations that reached a terminal state, by state.",
		}, []string{"queue", "state"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lakeshore_dispatch_latency_seconds", Help: "How long a claimed invocation waited for a worker since it became claimable.",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600},
		}, []string{"queue"}),
		held: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lakeshore_provision_held_total", Help: "Provisioner passes that held back a key with queued work because its hosts failed (stopped: 3 in a row).",
		}, []string{"queue", "stopped"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lakeshore_provision_refusals_total", Help: "Provisioner passes that launched nothing because the configuration is refused (reason launch_template: it does not exist).",
		}, []string{"reason"}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "lakeshore_store_requests_total", Help: "Requests this process sent to DynamoDB (or the embedded store), by operation; a retried request counts once per attempt.",
		}, []string{"operation"}),
	}
	p.reg.MustRegister(p.claims, p.conflicts, p.handedBack, p.finished, p.latency, p.held, p.refused, p.requests)
	if read != nil {
		p.reg.MustRegister(&gaugeCollector{read: read, log: log})
	}
	return p
}

// Handler serves /metrics.
func (p *Prometheus) Handler() http.Handler {
	return promhttp.HandlerFor(p.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}

func (p *Prometheus) Claimed(queue string, n, conflicts int, waited []time.Duration) {
	p.claims.WithLabelValues(queue).Add(float64(n))
	if conflicts > 0 {
		p.conflicts.WithLabelValues(queue).Add(float64(conflicts))
	}
	h := p.latency.WithLabelValues(queue)
	for _, d := range waited {
		h.Observe(d.Seconds())
	}
}

func (p *Prometheus) HandedBack(queue string, ended domain.EndKind) {
	p.handedBack.WithLabelValues(queue, string(ended)).Inc()
}

func (p *Prometheus) Finished(queue string, state domain.InvocationState) {
	p.finished.WithLabelValues(queue, string(state)).Inc()
}

func (p *Prometheus) KeyHeld(queue string, stopped bool) {
	p.held.WithLabelValues(queue, strconv.FormatBool(stopped)).Inc()
}

func (p *Prometheus) ProvisionRefused(why string) {
	p.refused.WithLabelValues(why).Inc()
}

// StoreRequest counts one request to the store, of operation op (give it
// to store.OnRequest).
func (p *Prometheus) StoreRequest(op string) {
	p.requests.WithLabelValues(op).Inc()
}

// gaugeCollector reads the gauges at each scrape.
type gaugeCollector struct {
	read func(context.Context) (metrics.Gauges, error)
	log  *slog.Logger
}

var (
	descDepth = prometheus.NewDesc("lakeshore_queue_invocations",
		"Invocations of a queue by state (state=\"queued\" is its depth).", []string{"queue", "state"}, nil)
	descOldest = prometheus.NewDesc("lakeshore_queue_oldest_queued_age_seconds",
		"How long the queue's oldest queued invocation has waited (0: none waits).", []string{"queue"}, nil)
	descWorkers = prometheus.NewDesc("lakeshore_workers",
		"Workers by the state they read now (stale computed).", []string{"state"}, nil)
	descRuns = prometheus.NewDesc("lakeshore_runs",
		"Runs by state (submitting, running, done).", []string{"state"}, nil)
)

func (c *gaugeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descDepth
	ch <- descOldest
	ch <- descWorkers
	ch <- descRuns
}

func (c *gaugeCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), gaugeTimeout)
	defer cancel()
	g, err := c.read(ctx)
	if err != nil {
		if c.log != nil {
			c.log.Warn("metrics: gauges not read", "error", err.Error())
		}
		ch <- prometheus.NewInvalidMetric(descDepth, err)
		return
	}
	// Every state, zeros too: an alarm on a series that is absent when
	// nothing is in that state never fires.
	for _, q := range g.Queues {
		for _, state := range domain.InvocationStates {
			ch <- prometheus.MustNewConstMetric(descDepth, prometheus.GaugeValue, float64(q.Counts[state]), q.Queue, string(state))
		}
		ch <- prometheus.MustNewConstMetric(descOldest, prometheus.GaugeValue, q.OldestQueuedAge.Seconds(), q.Queue)
	}
	for _, state := range domain.WorkerStates {
		ch <- prometheus.MustNewConstMetric(descWorkers, prometheus.GaugeValue, float64(g.Workers[state]), string(state))
	}
	for _, state := range domain.RunStates {
		ch <- prometheus.MustNewConstMetric(descRuns, prometheus.GaugeValue, float64(g.Runs[state]), string(state))
	}
}
