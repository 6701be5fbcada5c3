package agent

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/dreamlake/lakeshore/agent/internal/notify"
	"github.com/dreamlake/lakeshore/agent/internal/process"
	"github.com/dreamlake/lakeshore/agent/internal/sigv4"
	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Config is everything nymph is told at start (docs/design.md §6 flags). Its
// durations mean what they say, zero included: DefaultConfig holds the
// flags' defaults, and New never puts one in place of a zero.
type Config struct {
	ControlPlane string
	EnrollToken  string
	Queue        string
	Label        string
	Tags         map[string]string
	Capacity     int
	Workdir      string
	StateDir     string
	KeepAlive    time.Duration // exit after this long idle; 0: never exit for idleness
	Grace        time.Duration // how long in-flight work may finish once draining; 0: none, terminate at once
	KillAfter    time.Duration // SIGTERM → this long → SIGKILL; 0: SIGKILL right after SIGTERM
	HostSetup    []string
	// AdoptHostSetup: a generic worker (no HostSetup) that, idle, may be
	// asked to run a queued invocation's host_setup and advertise its host
	// key from then on (--adopt-host-setup; adopt.go).
	AdoptHostSetup bool
	IntrospectAddr string
	// LifecycleAddr is the loopback address of the endpoint each body
	// reads its lifecycle view at (NYMPH_LIFECYCLE_URL; lifecycle.go):
	// port 0 picks a free one; "" or "off" serves none.
	LifecycleAddr string
	// WarmKeepAlive is how long a resident body's idle warm process is
	// kept (--warm-keep-alive; docs/warm.md); 0: none is kept idle.
	WarmKeepAlive time.Duration
	MachineID     string
	PollInterval  time.Duration // 0: what the control plane answers (hello's poll_interval_s)
	// KeepRuns is how long a finished run's directory stays once its ack is
	// answered, counted from the run's end (--keep-runs); 0: it goes as
	// soon as the ack is answered.
	KeepRuns time.Duration
	// KeepRunsSize caps the run directories' total size in bytes
	// (--keep-runs-size): while it is exceeded, finished runs go, oldest
	// first; 0: no cap.
	KeepRunsSize int64
	Version      string
	// Insecure accepts a plain-http control plane on another host
	// (--insecure); without it only https, or http to loopback, is allowed.
	Insecure bool
	// RunAs names the account bodies and their run_setup run as (--run-as);
	// empty: the daemon's own. Host setup and setup commands stay the
	// daemon's: they prepare the host.
	RunAs string
	// PassEnv names variables of the daemon's environment that bodies get
	// too (--pass-env); by default a body sees only PATH, HOME, LANG,
	// LC_ALL, TMPDIR, USER and LOGNAME of it.
	PassEnv []string
	// IAM signs every request to the control plane with the EC2 instance
	// role (AWS SigV4 for execute-api, --iam), for a control plane whose
	// daemon routes sit behind API Gateway's AWS_IAM authorizer; the token
	// then travels in X-Lakeshore-Token (agent/internal/sigv4).
	IAM bool
	// IAMRegion is the region IAM mode signs for (--iam-region); empty: the
	// region of an execute-api control-plane host, else the instance's.
	IAMRegion string
	// OnRebalance is what an EC2 rebalance recommendation does
	// (--on-rebalance): OnRebalanceDrain starts a drain (bye drain),
	// OnRebalanceLog (the default, also "") only logs it (spot.go).
	OnRebalance string

	Logger *slog.Logger
	HTTP   *http.Client
	// HelloAttempts bounds hello's retries (default 8, backoff 0.5 s doubling
	// to 10 s, jittered).
	HelloAttempts int
	// IMDSEndpoint overrides the EC2 metadata endpoint (tests).
	IMDSEndpoint string
	// Notifier hears READY=1, STOPPING=1 and STATUS (agent/internal/notify);
	// nil: $NOTIFY_SOCKET's, when a service manager set it (systemd
	// Type=notify).
	Notifier notify.Notifier
	// Clock is the one clock every part of the daemon reads: idle and
	// keep-alive, the drain's grace, run durations, ack stamps, health,
	// request signing (zero: real time; tests run the daemon in a synctest
	// bubble or hand it a fake). Deadlines and timers run on real time.
	Clock clock.Clock
}

// The flags' defaults (DefaultConfig), for durations left unset.
const (
	DefaultGrace     = 30 * time.Second
	DefaultKillAfter = 10 * time.Second
	// DefaultKeepRuns and DefaultKeepRunsSize bound the run directories a
	// worker keeps (docs/agent.md#run-directories).
	DefaultKeepRuns     = 24 * time.Hour
	DefaultKeepRunsSize = 2 << 30
	// DefaultHelloAttempts bounds hello's retries (StartBudget).
	DefaultHelloAttempts = 8
	byeTimeout           = 2 * time.Second
	requestTimeout       = 15 * time.Second
)

// DefaultConfig reports nymph's defaults, the flags' own (docs/design.md §6): start
// from it and fill in the control plane, the enrollment token and the
// queue. A Config built from scratch has no grace and no kill-after (both
// zero), which New takes as given.
func DefaultConfig() Config {
	return Config{
		Capacity:       1,
		Workdir:        "/var/lib/nymph/work",
		StateDir:       "/var/lib/nymph/state",
		Grace:          DefaultGrace,
		KillAfter:      DefaultKillAfter,
		KeepRuns:       DefaultKeepRuns,
		KeepRunsSize:   DefaultKeepRunsSize,
		IntrospectAddr: "127.0.0.1:7788",
		LifecycleAddr:  "127.0.0.1:0",
		WarmKeepAlive:  process.DefaultWarmKeepAlive,
		HelloAttempts:  DefaultHelloAttempts,
		OnRebalance:    OnRebalanceLog,
	}
}

// withDefaults fills zero values that cannot mean zero (capacity, hello
// attempts, logger, HTTP client, notifier) and checks the rest. Durations
// are taken as given: a zero grace or kill-after is zero.
func (c Config) withDefaults() (Config, error) {
	u, err := url.Parse(c.ControlPlane)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return c, fmt.Errorf("--control-plane must be an http(s) URL, got %q", c.ControlPlane)
	}
	if err := checkTransport(u, c.Insecure); err != nil {
		return c, err
	}
	if c.LifecycleAddr != "" && c.LifecycleAddr != "off" {
		if ap, err := netip.ParseAddrPort(c.LifecycleAddr); err != nil || !ap.Addr().IsLoopback() {
			return c, fmt.Errorf("--lifecycle-addr %q: want a loopback address and port, e.g. 127.0.0.1:0, or off", c.LifecycleAddr)
		}
	}
	for _, name := range c.PassEnv {
		if name == "" || strings.ContainsAny(name, "=\x00") {
			return c, fmt.Errorf("--pass-env takes variable names, got %q", name)
		}
		if strings.HasPrefix(name, "NYMPH_") {
			return c, fmt.Errorf("--pass-env %s: the daemon's own NYMPH_ settings (its tokens among them) never reach a body", name)
		}
	}
	if c.EnrollToken == "" {
		return c, fmt.Errorf("--enroll-token is required")
	}
	if !wire.ValidQueue(c.Queue) {
		return c, fmt.Errorf("--queue must be a queue name (1-64 of A-Z a-z 0-9 _ . -), got %q", c.Queue)
	}
	if c.Capacity == 0 {
		c.Capacity = 1
	}
	if c.Capacity < 1 || c.Capacity > wire.MaxConcurrency {
		return c, fmt.Errorf("--capacity must be 1-%d, got %d", wire.MaxConcurrency, c.Capacity)
	}
	if c.Workdir == "" {
		return c, fmt.Errorf("--workdir is required")
	}
	if c.StateDir == "" {
		return c, fmt.Errorf("--state-dir is required")
	}
	if c.Grace < 0 || c.KillAfter < 0 || c.KeepAlive < 0 || c.PollInterval < 0 || c.KeepRuns < 0 || c.WarmKeepAlive < 0 {
		return c, fmt.Errorf("durations must not be negative")
	}
	if c.KeepRunsSize < 0 {
		return c, fmt.Errorf("--keep-runs-size must not be negative")
	}
	switch c.OnRebalance {
	case "":
		c.OnRebalance = OnRebalanceLog
	case OnRebalanceLog, OnRebalanceDrain:
	default:
		return c, fmt.Errorf("--on-rebalance must be %s or %s, got %q", OnRebalanceDrain, OnRebalanceLog, c.OnRebalance)
	}
	if c.HelloAttempts == 0 {
		c.HelloAttempts = DefaultHelloAttempts
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Notifier == nil {
		n, err := notify.FromEnv(os.Getenv)
		if err != nil {
			c.Logger.Warn("not notifying the service manager", "error", err.Error())
		}
		c.Notifier = n
	}
	if c.HTTP == nil {
		c.HTTP = &http.Client{Timeout: requestTimeout}
	}
	if c.IAMRegion != "" && !c.IAM {
		return c, fmt.Errorf("--iam-region is only used with --iam")
	}
	if c.IAM {
		hc, err := sigv4.NewClient(c.HTTP, sigv4.Options{
			ControlPlane: c.ControlPlane, Region: c.IAMRegion, IMDSEndpoint: c.IMDSEndpoint,
			Getenv: os.Getenv, Clock: c.Clock, Logger: c.Logger,
		})
		if err != nil {
			return c, err
		}
		c.HTTP = hc
	}
	return c, nil
}
