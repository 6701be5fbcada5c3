package main

import (
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/agent"
	"github.com/dreamlake/lakeshore/agent/internal/process"
)

// TestParseFlagsDurations: every duration flag, and its NYMPH_ variable,
// tells "unset" (the default) from an explicit zero and from a value; the
// command line wins over the environment, and an empty variable is unset.
func TestParseFlagsDurations(t *testing.T) {
	required := []string{"--control-plane", "http://127.0.0.1:1", "--enroll-token", "e", "--queue", "q"}
	read := map[string]func(agent.Config) time.Duration{
		"grace":           func(c agent.Config) time.Duration { return c.Grace },
		"kill-after":      func(c agent.Config) time.Duration { return c.KillAfter },
		"keep-alive":      func(c agent.Config) time.Duration { return c.KeepAlive },
		"poll-interval":   func(c agent.Config) time.Duration { return c.PollInterval },
		"warm-keep-alive": func(c agent.Config) time.Duration { return c.WarmKeepAlive },
	}
	unset := map[string]time.Duration{
		"grace":           agent.DefaultGrace,
		"kill-after":      agent.DefaultKillAfter,
		"keep-alive":      0, // never exit for idleness
		"poll-interval":   0, // what the control plane answers
		"warm-keep-alive": process.DefaultWarmKeepAlive,
	}
	for flag, get := range read {
		env := "NYMPH_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
		for _, tc := range []struct {
			name   string
			args   []string
			envVal string
			want   time.Duration
		}{
			{"unset", nil, "", unset[flag]},
			{"flag 0s", []string{"--" + flag, "0s"}, "", 0},
			{"flag 0", []string{"--" + flag + "=0"}, "", 0},
			{"flag value", []string{"--" + flag, "7s"}, "", 7 * time.Second},
			{"env 0s", nil, "0s", 0},
			{"env 0", nil, "0", 0},
			{"env value", nil, "7s", 7 * time.Second},
			{"flag 0s over env value", []string{"--" + flag, "0s"}, "7s", 0},
			{"flag value over env 0s", []string{"--" + flag, "7s"}, "0s", 7 * time.Second},
		} {
			t.Run(flag+"/"+tc.name, func(t *testing.T) {
				getenv := func(k string) string {
					if k == env {
						return tc.envVal
					}
					return ""
				}
				c, _, err := parseFlags(append(append([]string(nil), required...), tc.args...), getenv)
				if err != nil {
					t.Fatal(err)
				}
				if got := get(c); got != tc.want {
					t.Fatalf("%s = %s, want %s", flag, got, tc.want)
				}
			})
		}
	}
}

// TestParseFlagsDefaults: what the flags leave unset is agent.DefaultConfig.
func TestParseFlagsDefaults(t *testing.T) {
	c, _, err := parseFlags([]string{"--control-plane", "http://127.0.0.1:1", "--enroll-token", "e", "--queue", "q"},
		func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	d := agent.DefaultConfig()
	if c.Grace != d.Grace || c.KillAfter != d.KillAfter || c.KeepAlive != d.KeepAlive || c.PollInterval != d.PollInterval ||
		c.Capacity != d.Capacity || c.Workdir != d.Workdir || c.StateDir != d.StateDir || c.IntrospectAddr != d.IntrospectAddr ||
		c.HelloAttempts != d.HelloAttempts {
		t.Fatalf("parsed %+v\nwant the defaults of %+v", c, d)
	}
}

// TestRunExitCodes: flag errors are usage errors (2). (What Run's errors
// map to is agent.ExitCode's, tested in the agent package and end to end in
// tests/agent_exit_test.go.)
func TestRunExitCodes(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"unknown flag", []string{"--no-such-flag"}},
		{"bad duration", []string{"--grace", "soon"}},
		{"bad duration in the environment", nil},
	} {
		getenv := func(k string) string {
			if k == "NYMPH_KILL_AFTER" && tc.args == nil {
				return "later"
			}
			return ""
		}
		if got := run(tc.args, getenv); got != agent.ExitUsage {
			t.Errorf("%s: exit %d, want %d", tc.name, got, agent.ExitUsage)
		}
	}
}

// TestHelpVersionAndBareUsage: --help goes to stdout and exits 0,
// --version prints the version, a bare nymph prints how to run it (not a
// missing-flag error), and --capacity 0 is refused like -1.
func TestHelpVersionAndBareUsage(t *testing.T) {
	none := func(string) string { return "" }
	var out, errs strings.Builder
	if code := runIO([]string{"--help"}, none, &out, &errs); code != agent.ExitOK || !strings.Contains(out.String(), "--control-plane") || errs.Len() != 0 {
		t.Fatalf("--help: exit %d, stdout %q, stderr %q; want the flags on stdout, exit 0", code, out.String(), errs.String())
	}
	out.Reset()
	if code := runIO([]string{"--version"}, none, &out, &errs); code != agent.ExitOK || strings.TrimSpace(out.String()) != "nymph "+version {
		t.Fatalf("--version: exit %d, stdout %q", code, out.String())
	}
	out.Reset()
	if code := runIO(nil, none, &out, &errs); code != agent.ExitUsage || !strings.HasPrefix(errs.String(), "usage: nymph --control-plane URL") {
		t.Fatalf("bare nymph: exit %d, stderr %q; want the usage line", code, errs.String())
	}
	required := []string{"--control-plane", "http://127.0.0.1:1", "--enroll-token", "e", "--queue", "q"}
	for _, n := range []string{"0", "-1"} {
		if _, _, err := parseFlags(append(append([]string(nil), required...), "--capacity", n), none); err == nil || !strings.Contains(err.Error(), "--capacity must be 1-") {
			t.Errorf("--capacity %s: %v, want refused", n, err)
		}
	}
	if _, _, err := parseFlags(required, none); err != nil {
		t.Fatalf("the default capacity: %v", err)
	}
}
