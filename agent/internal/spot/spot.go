// Package spot watches EC2's instance metadata (through agent/internal/imds)
// for a spot interruption notice and a rebalance recommendation. The agent
// starts one watcher at boot (Endpoint says whether and where) and its loop
// drains on what the watcher sends.
package spot

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/imds"
	"github.com/dreamlake/lakeshore/agent/internal/machineid"
)

// Kind says which notice a Notice is.
type Kind string

// Kinds of Notice.
const (
	Interruption Kind = "interruption" // spot/instance-action: the instance is reclaimed at Time
	Rebalance    Kind = "rebalance"    // events/recommendations/rebalance: an elevated risk, no deadline
)

// Defaults of Options.
const (
	DefaultInterval = 5 * time.Second
	// requestTimeout bounds each IMDS exchange (its token and its GET): a
	// slow answer is retried on the next tick rather than waited for.
	requestTimeout = 2 * time.Second
)

// The notice paths, under latest/meta-data/.
const (
	actionPath    = "spot/instance-action"
	rebalancePath = "events/recommendations/rebalance"
)

// Notice is one notice from EC2's instance metadata: an interruption
// (Action terminate, stop or hibernate, at Time) or a rebalance
// recommendation (Time is when it was issued; Action is empty).
type Notice struct {
	Kind   Kind
	Action string
	Time   time.Time
}

// Options configures Watch.
type Options struct {
	// Endpoint is the IMDS base URL (required; Endpoint says how the agent
	// picks it).
	Endpoint string
	// Interval between polls; zero means DefaultInterval.
	Interval time.Duration
	// HTTP is the client for IMDS; nil means a proxy-less, keep-alive-less
	// one. The session token is the SDK's to keep (imds.New).
	HTTP   *http.Client
	Logger *slog.Logger
}

// Watch polls IMDSv2 every Interval for a spot interruption notice and
// a rebalance recommendation, and sends each new notice once (a notice that
// changes — another action or time — is new again). Errors are logged at
// debug and retried on the next tick. The channel is closed when ctx ends.
func Watch(ctx context.Context, opts Options) <-chan Notice {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.HTTP == nil {
		opts.HTTP = &http.Client{Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	w := &watcher{opts: opts, md: imds.New(opts.Endpoint, imds.Options{HTTP: opts.HTTP}), seen: map[Kind]Notice{}}
	out := make(chan Notice)
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

type watcher struct {
	opts Options
	md   imds.Getter
	seen map[Kind]Notice
}

// check polls both paths once and returns the notices not sent before.
func (w *watcher) check(ctx context.Context) []Notice {
	var out []Notice
	for _, kind := range []Kind{Interruption, Rebalance} {
		n, ok, err := w.fetch(ctx, kind)
		if err != nil {
			if ctx.Err() == nil {
				w.opts.Logger.Debug("spot watcher: imds", "kind", string(kind), "error", err.Error())
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
func (w *watcher) fetch(ctx context.Context, kind Kind) (Notice, bool, error) {
	path := actionPath
	if kind == Rebalance {
		path = rebalancePath
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	body, ok, err := imds.Get(ctx, w.md, path, 64<<10)
	if err != nil || !ok {
		return Notice{}, false, err
	}
	n := Notice{Kind: kind}
	if kind == Interruption {
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

// Endpoint says whether and where the agent watches for spot notices: only
// on EC2 (the machine id came from IMDS: machineIDSource is
// machineid.SourceIMDS) or when an endpoint was set explicitly (configured,
// the agent's Config.IMDSEndpoint, or $AWS_EC2_METADATA_SERVICE_ENDPOINT),
// so other hosts and tests never contact 169.254.169.254.
// AWS_EC2_METADATA_DISABLED=true turns it off unless configured is set.
func Endpoint(configured, machineIDSource string, getenv func(string) string) (string, bool) {
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
