package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

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
	// DefaultSpotTokenTTL is the IMDSv2 session token's lifetime; the watcher
	// asks for a new one shortly before it runs out.
	DefaultSpotTokenTTL = 6 * time.Hour
	// spotRequestTimeout bounds each IMDS request: a slow answer is retried on
	// the next tick rather than waited for.
	spotRequestTimeout = 2 * time.Second
)

const (
	spotActionPath    = "/latest/meta-data/spot/instance-action"
	spotRebalancePath = "/latest/meta-data/events/recommendations/rebalance"
	imdsTokenPath     = "/latest/api/token"
	imdsTTLHeader     = "X-aws-ec2-metadata-token-ttl-seconds"
	imdsTokenHeader   = "X-aws-ec2-metadata-token"
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
	// TokenTTL is the lifetime asked for each IMDSv2 token (whole seconds, at
	// least 1 s); zero means DefaultSpotTokenTTL.
	TokenTTL time.Duration
	// HTTP is the client for IMDS; nil means a proxy-less, keep-alive-less
	// client with a 2 s timeout.
	HTTP   *http.Client
	Logger *slog.Logger
	// Now is the clock the token's lifetime is measured with; nil means
	// time.Now. The poll interval always runs on a real ticker.
	Now func() time.Time
}

// WatchSpot polls IMDSv2 every Interval for a spot interruption notice and
// a rebalance recommendation, and sends each new notice once (a notice that
// changes — another action or time — is new again). Errors are logged at
// debug and retried on the next tick. The channel is closed when ctx ends.
func WatchSpot(ctx context.Context, opts SpotOptions) <-chan SpotNotice {
	if opts.Interval <= 0 {
		opts.Interval = DefaultSpotInterval
	}
	if opts.TokenTTL <= 0 {
		opts.TokenTTL = DefaultSpotTokenTTL
	}
	opts.TokenTTL = max(opts.TokenTTL.Truncate(time.Second), time.Second)
	if opts.HTTP == nil {
		opts.HTTP = imdsHTTPClient()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	w := &spotWatcher{opts: opts, endpoint: strings.TrimRight(opts.Endpoint, "/"), seen: map[string]SpotNotice{}}
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

// imdsHTTPClient talks to IMDS directly (never through a proxy: it would
// answer for the proxy's host) and keeps no idle connection between polls.
func imdsHTTPClient() *http.Client {
	return &http.Client{
		Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true},
		Timeout:   spotRequestTimeout,
	}
}

type spotWatcher struct {
	opts     SpotOptions
	endpoint string
	token    string
	expires  time.Time // when to stop using token (a margin before its TTL)
	seen     map[string]SpotNotice
}

// errIMDSUnauthorized means IMDS refused the token (expired or revoked).
var errIMDSUnauthorized = errors.New("imds: token refused")

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
	body, ok, err := w.get(ctx, path)
	if errors.Is(err, errIMDSUnauthorized) {
		w.token = "" // a fresh token, once
		body, ok, err = w.get(ctx, path)
	}
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

// get GETs path with a valid token: (body, true) on 200, (nil, false) on
// 404, errIMDSUnauthorized on 401, an error otherwise.
func (w *spotWatcher) get(ctx context.Context, path string) ([]byte, bool, error) {
	token, err := w.sessionToken(ctx)
	if err != nil {
		return nil, false, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, w.endpoint+path, nil)
	if err != nil {
		return nil, false, err
	}
	req.Header.Set(imdsTokenHeader, token)
	resp, err := w.opts.HTTP.Do(req)
	if err != nil {
		return nil, false, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, false, nil
	case resp.StatusCode == http.StatusUnauthorized:
		return nil, false, errIMDSUnauthorized
	case resp.StatusCode != http.StatusOK:
		return nil, false, fmt.Errorf("imds: GET %s: %s", path, resp.Status)
	case err != nil:
		return nil, false, err
	}
	return body, true, nil
}

// sessionToken returns the current IMDSv2 token, asking for a new one when
// there is none or it is about to expire.
func (w *spotWatcher) sessionToken(ctx context.Context) (string, error) {
	if w.token != "" && w.opts.Now().Before(w.expires) {
		return w.token, nil
	}
	w.token = ""
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, w.endpoint+imdsTokenPath, nil)
	if err != nil {
		return "", err
	}
	ttl := w.opts.TokenTTL
	req.Header.Set(imdsTTLHeader, strconv.Itoa(int(ttl/time.Second)))
	asked := w.opts.Now()
	resp, err := w.opts.HTTP.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("imds: token: %s", resp.Status)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", errors.New("imds: empty token")
	}
	// Stop using it a margin before it runs out: a quarter of its life, at
	// most a minute.
	w.token, w.expires = token, asked.Add(ttl-min(ttl/4, time.Minute))
	return token, nil
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
	if configured != "" {
		return configured, true
	}
	if strings.EqualFold(strings.TrimSpace(getenv("AWS_EC2_METADATA_DISABLED")), "true") {
		return "", false
	}
	if env := getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT"); env != "" {
		return env, true
	}
	if machineIDSource == MachineIDSourceIMDS {
		return DefaultIMDSEndpoint, true
	}
	return "", false
}

// spotGrace is how long in-flight work may still run once the instance is
// reclaimed at reclaim: enough before it that bodies are terminated
// (kill-after) and handed back (bye) in time — at most grace, never
// negative.
func spotGrace(grace, killAfter time.Duration, reclaim, now time.Time) time.Duration {
	if reclaim.IsZero() {
		return grace
	}
	return max(min(grace, reclaim.Sub(now)-killAfter-5*time.Second), 0)
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
			"notice_time", n.Time, "grace", a.cfg.Grace, "inflight", len(st.runs), "already_draining", st.draining)
		if !st.draining {
			a.startDrain(st, wire.ByeDrain)
		}
	case SpotInterruption:
		if st.spotReclaim.IsZero() || n.Time.Before(st.spotReclaim) {
			st.spotReclaim = n.Time
		}
		a.log.Warn("spot interruption notice: draining before the reclaim", "action", n.Action, "time", n.Time,
			"seconds_left", int(time.Until(n.Time).Seconds()),
			"grace", spotGrace(a.cfg.Grace, a.cfg.KillAfter, st.spotReclaim, time.Now()), "inflight", len(st.runs))
		if !st.draining {
			a.startDrain(st, wire.ByeSpotInterruption)
		}
	}
}
