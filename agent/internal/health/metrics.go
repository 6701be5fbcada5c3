package health

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The daemon's metrics: its Snapshot, as Prometheus text (docs/metrics.md).
var (
	descInflight = prometheus.NewDesc("lakeshore_nymph_inflight", "Runs in flight now.", nil, nil)
	descReady    = prometheus.NewDesc("lakeshore_nymph_ready", "1 when the daemon is ready (/readyz answers 200).", nil, nil)
	descLive     = prometheus.NewDesc("lakeshore_nymph_live", "1 when the daemon is live (/livez answers 200).", nil, nil)
	descUptime   = prometheus.NewDesc("lakeshore_nymph_uptime_seconds", "Seconds since the daemon started.", nil, nil)
	descPollAge  = prometheus.NewDesc("lakeshore_nymph_since_last_poll_ok_seconds", "Seconds since a poll last succeeded (absent before the first).", nil, nil)
	descPending  = prometheus.NewDesc("lakeshore_nymph_requests_outstanding", "Requests to the control plane in flight, by role.", []string{"role"}, nil)
	descFinished = prometheus.NewDesc("lakeshore_nymph_runs_finished_total", "Runs that ended, by outcome state.", []string{"state"}, nil)
)

// snapshotCollector reads h's Snapshot at each scrape: no I/O, never waits
// on the main loop.
type snapshotCollector struct{ h *Tracker }

func (c snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descInflight, descReady, descLive, descUptime, descPollAge, descPending, descFinished} {
		ch <- d
	}
}

func (c snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.h.Snapshot()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(descInflight, float64(s.Inflight))
	gauge(descReady, boolValue(s.Ready))
	gauge(descLive, boolValue(s.Live))
	gauge(descUptime, s.UptimeS)
	if s.SinceLastPollOKS != nil {
		gauge(descPollAge, *s.SinceLastPollOKS)
	}
	for role, r := range s.Roles {
		gauge(descPending, float64(r.Outstanding), role)
	}
	for state, n := range s.Finished {
		ch <- prometheus.MustNewConstMetric(descFinished, prometheus.CounterValue, float64(n), state)
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func metricsHandler(h *Tracker) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(snapshotCollector{h})
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
}
