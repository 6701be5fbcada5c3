package agent

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

// configTestBase is the least Config New accepts.
func configTestBase() Config {
	return Config{
		ControlPlane: "http://127.0.0.1:1", EnrollToken: "e", Queue: "q", Workdir: "w", StateDir: "s",
		Logger: slog.New(slog.DiscardHandler), Notifier: nopNotifier{},
	}
}

type nopNotifier struct{}

func (nopNotifier) Notify(string) error { return nil }

// TestConfigDurationsMeanWhatTheySay: a Config's durations are taken as
// given. A zero --grace is no grace and a zero --kill-after is SIGKILL right
// after SIGTERM, not 30 s and 10 s in disguise; the defaults come from
// DefaultConfig (the flags' defaults), not from a zero.
func TestConfigDurationsMeanWhatTheySay(t *testing.T) {
	for _, tc := range []struct {
		name                                  string
		grace, killAfter, keepAlive, interval time.Duration
	}{
		{"all zero", 0, 0, 0, 0},
		{"values", 7 * time.Second, 3 * time.Second, time.Minute, 2 * time.Second},
		{"zero grace, some kill-after", 0, time.Second, 0, 0},
		{"some grace, zero kill-after", time.Second, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := configTestBase()
			c.Grace, c.KillAfter, c.KeepAlive, c.PollInterval = tc.grace, tc.killAfter, tc.keepAlive, tc.interval
			got, err := c.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			if got.Grace != tc.grace || got.KillAfter != tc.killAfter || got.KeepAlive != tc.keepAlive || got.PollInterval != tc.interval {
				t.Fatalf("grace %s, kill-after %s, keep-alive %s, poll interval %s; want %s, %s, %s, %s",
					got.Grace, got.KillAfter, got.KeepAlive, got.PollInterval, tc.grace, tc.killAfter, tc.keepAlive, tc.interval)
			}
		})
	}
	for _, set := range []func(*Config){
		func(c *Config) { c.Grace = -time.Second },
		func(c *Config) { c.KillAfter = -time.Second },
		func(c *Config) { c.KeepAlive = -time.Second },
		func(c *Config) { c.PollInterval = -time.Second },
		func(c *Config) { c.KeepRuns = -time.Second },
		func(c *Config) { c.KeepRunsSize = -1 },
	} {
		c := configTestBase()
		set(&c)
		if _, err := c.withDefaults(); err == nil || !strings.Contains(err.Error(), "negative") {
			t.Errorf("a negative duration: err %v", err)
		}
	}
}

// TestDefaultConfig: what the flags default to, and what a daemon started
// from DefaultConfig keeps once its required settings are filled in.
func TestDefaultConfig(t *testing.T) {
	d := DefaultConfig()
	if d.Grace != DefaultGrace || d.KillAfter != DefaultKillAfter || d.KeepAlive != 0 || d.PollInterval != 0 ||
		d.Capacity != 1 || d.HelloAttempts != DefaultHelloAttempts ||
		d.KeepRuns != DefaultKeepRuns || d.KeepRunsSize != DefaultKeepRunsSize {
		t.Fatalf("DefaultConfig: %+v", d)
	}
	c := configTestBase()
	d.ControlPlane, d.EnrollToken, d.Queue, d.Workdir, d.StateDir, d.Logger, d.Notifier =
		c.ControlPlane, c.EnrollToken, c.Queue, c.Workdir, c.StateDir, c.Logger, c.Notifier
	got, err := d.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if got.Grace != DefaultGrace || got.KillAfter != DefaultKillAfter {
		t.Fatalf("grace %s, kill-after %s; want the defaults", got.Grace, got.KillAfter)
	}
}

// TestLifecycleAddr: the lifecycle endpoint listens on loopback only, by
// default on a free port; "" and "off" serve none.
func TestLifecycleAddr(t *testing.T) {
	if d := DefaultConfig(); d.LifecycleAddr != "127.0.0.1:0" {
		t.Fatalf("default --lifecycle-addr %q", d.LifecycleAddr)
	}
	for addr, ok := range map[string]bool{"127.0.0.1:0": true, "[::1]:9000": true, "off": true, "": true,
		"0.0.0.0:0": false, "10.0.0.1:80": false, "localhost": false, "127.0.0.1": false} {
		c := configTestBase()
		c.LifecycleAddr = addr
		_, err := c.withDefaults()
		if (err == nil) != ok {
			t.Errorf("--lifecycle-addr %q: %v, want accepted %v", addr, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), "loopback") {
			t.Errorf("--lifecycle-addr %q: %v does not say what it wants", addr, err)
		}
	}
}
