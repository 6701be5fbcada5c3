package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	sdkimds "github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/dreamlake/lakeshore/agent/internal/imds"
	"github.com/dreamlake/lakeshore/agent/internal/machineid"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Kinds of SpotNotice.
const (
	SpotInterruption = "interruption" // spot/instance-action: the instance is reclaimed at Time
	SpotRebalance    = "rebalance"    // events/recommendations/rebalance: an elevated risk, no deadline
)

// What a rebalance recommendation does (Config.OnRebalance, --on-rebalance).
const (
	OnRebalanceDrain = "drain" // drain as a drain command would: no more claims, the grace, bye drain
	OnRebalanceLog   = "log"   // log it and carry on (the default)
)

// Defaults of SpotOptions.
const (
	DefaultSpotInterval = 5 * time.Second
	// spotRequestTimeout bounds each IMDS exchange (its token and its GET):
	// a slow answer is retried on the next tick rather than waited for.
	spotRequestTimeout = 2 * time.Second
)

// The notice paths, under latest/meta-data/.
const (
	spotActionPath    = "spot/instance-action"
	spotRebalancePath = "events/recommendations/rebalance"
)

// SpotNotice is one notice from EC2's instance metadata: an interruption
// (Action terminate, stop or hibernate, at Time) or a rebalance
// recommendation (Time is when it was issued; Action is empty).
type SpotNotice struct {
	Kind   string // SpotInterruption | SpotRebalance
	Action string
	Time   time.Time
}

// SpotOptions configures WatchSpot.
type SpotOptions struct {
	// Endpoint is the IMDS base URL (required; see spotEndpoint for how the
	// agent picks it).
	Endpoint string
	// Interval between polls; zero means DefaultSpotInterval.
	Interval time.Duration
	// HTTP is the client for IMDS; nil means a proxy-less, keep-alive-less
	// one. The session token is the SDK's to keep (imds.New).
	HTTP   *http.Client
	Logger *slog.Logger
}

// WatchSpot polls IMDSv2 every Interval for a spot interruption notice and
// a rebalance recommendation, and sends each new notice once (a notice that
// changes — another action or time — is new again). Errors are logged at
// debug and retried on the next tick. The channel is closed when ctx ends.
func WatchSpot(ctx context.Context, opts SpotOptions) <-chan SpotNotice {
	if opts.Interval <= 0 {
		opts.Interval = DefaultSpotInterval
	}
	if opts.HTTP == nil {
		opts.HTTP = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	w := &spotWatcher{opts: opts, md: imds.New(opts.Endpoint, imds.Options{HTTP: opts.HTTP}), seen: map[string]SpotNotice{}}
	out := make(chan SpotNotice)
	go func() {
		defer close(out)
		tick := time.NewTicker(opts.Interval)
		defer tick.Stop()
		for {
			for _, n := range w.check(ctx) {
				select {
				case out <- n:
				case <-ctx.Done():
					return
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return out
}

type spotWatcher struct {
	opts SpotOptions
	md   *sdkimds.Client
	seen map[string]SpotNotice
}

// check polls both paths once and returns the notices not sent before.
func (w *spotWatcher) check(ctx context.Context) []SpotNotice {
	var out []SpotNotice
	for _, kind := range []string{SpotInterruption, SpotRebalance} {
		n, ok, err := w.fetch(ctx, kind)
		if err != nil {
			if ctx.Err() == nil {
				w.opts.Logger.Debug("spot watcher: imds", "kind", kind, "error", err.Error())
			}
			continue
		}
		if !ok {
			continue // 404: no notice (a withdrawn one may come back as new)
		}
		if prev, sent := w.seen[kind]; sent && prev.Action == n.Action && prev.Time.Equal(n.Time) {
			continue
		}
		w.seen[kind] = n
		out = append(out, n)
	}
	return out
}

// fetch reads one notice path: ok false on 404.
func (w *spotWatcher) fetch(ctx context.Context, kind string) (SpotNotice, bool, error) {
	path := spotActionPath
	if kind == SpotRebalance {
		path = spotRebalancePath
	}
	ctx, cancel := context.WithTimeout(ctx, spotRequestTimeout)
	defer cancel()
	body, ok, err := imds.Get(ctx, w.md, path, 64<<10)
	if err != nil || !ok {
		return SpotNotice{}, false, err
	}
	n := SpotNotice{Kind: kind}
	if kind == SpotInterruption {
		var v struct {
			Action string `json:"action"`
			Time   string `json:"time"`
		}
		if err := json.Unmarshal(body, &v); err != nil {
			return n, false, fmt.Errorf("imds: instance-action: %w", err)
		}
		t, err := time.Parse(time.RFC3339, v.Time)
		if err != nil || v.Action == "" {
			return n, false, fmt.Errorf("imds: instance-action without an action and a time")
		}
		n.Action, n.Time = v.Action, t
		return n, true, nil
	}
	var v struct {
		NoticeTime string `json:"noticeTime"`
	}
	if err := json.Unmarshal(body, &v); err != nil {
		return n, false, fmt.Errorf("imds: rebalance: %w", err)
	}
	if t, err := time.Parse(time.RFC3339, v.NoticeTime); err == nil {
		n.Time = t
	}
	return n, true, nil
}

// spotEndpoint says whether and where the agent watches for spot notices:
// only on EC2 (the machine id came from IMDS) or when an endpoint was set
// explicitly (Config.IMDSEndpoint or $AWS_EC2_METADATA_SERVICE_ENDPOINT), so
// other hosts and tests never contact 169.254.169.254.
// AWS_EC2_METADATA_DISABLED=true turns it off unless Config.IMDSEndpoint is
// set.
func spotEndpoint(configured, machineIDSource string, getenv func(string) string) (string, bool) {
	if getenv == nil {
		getenv = os.Getenv
	}
	endpoint, src := imds.Resolve(configured, getenv)
	switch src {
	case imds.Configured, imds.FromEnv:
		return endpoint, true
	case imds.Default:
		if machineIDSource == machineid.SourceIMDS {
			return endpoint, true
		}
		return "", false
	default:
		return "", false
	}
}

// spotNotice is the loop's handling of a notice: an interruption starts the
// drain (bye spot_interruption) and records the reclaim time, which the loop
// uses to shorten the grace (spotGrace); a rebalance recommendation starts
// the drain (bye drain: no deadline is known, so the grace is the
// configured one) with --on-rebalance drain, and is only logged with log.
func (a *Agent) spotNotice(st *state, n SpotNotice) {
	switch n.Kind {
	case SpotRebalance:
		if a.cfg.OnRebalance != OnRebalanceDrain {
			a.log.Warn("EC2 rebalance recommendation: this spot instance is at elevated risk of interruption; carrying on (--on-rebalance log)",
				"notice_time", n.Time)
			return
		}
		a.log.Warn("EC2 rebalance recommendation: this spot instance is at elevated risk of interruption; draining (--on-rebalance drain)",
			"notice_time", n.Time, "grace", a.cfg.Grace, "inflight", len(st.runs), "already_draining", st.phase.leaving())
		a.startDrain(st, wire.ByeDrain)
	case SpotInterruption:
		if st.spotReclaim.IsZero() || n.Time.Before(st.spotReclaim) {
			st.spotReclaim = n.Time
		}
		a.log.Warn("spot interruption notice: draining before the reclaim", "action", n.Action, "time", n.Time,
			"seconds_left", int(n.Time.Sub(a.now()).Seconds()),
			"grace", spotGrace(a.cfg.Grace, a.cfg.KillAfter, st.spotReclaim, a.now()), "inflight", len(st.runs))
		a.startDrain(st, wire.ByeSpotInterruption)
	}
}
