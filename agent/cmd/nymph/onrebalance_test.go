package main

import (
	"testing"

	"github.com/dreamlake/lakeshore/agent"
)

// TestParseFlagsOnRebalance: --on-rebalance defaults to log, is read from
// NYMPH_ON_REBALANCE, and the command line wins over the environment.
// (Values other than drain and log are refused by agent.New.)
func TestParseFlagsOnRebalance(t *testing.T) {
	required := []string{"--control-plane", "http://127.0.0.1:1", "--enroll-token", "e", "--queue", "q"}
	for _, tc := range []struct {
		name, env string
		args      []string
		want      string
	}{
		{"default", "", nil, agent.OnRebalanceLog},
		{"flag", "", []string{"--on-rebalance", "drain"}, agent.OnRebalanceDrain},
		{"env", "drain", nil, agent.OnRebalanceDrain},
		{"flag over env", "drain", []string{"--on-rebalance=log"}, agent.OnRebalanceLog},
	} {
		getenv := func(k string) string {
			if k == "NYMPH_ON_REBALANCE" {
				return tc.env
			}
			return ""
		}
		c, _, err := parseFlags(append(append([]string(nil), required...), tc.args...), getenv)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if c.OnRebalance != tc.want {
			t.Errorf("%s: OnRebalance = %q, want %q", tc.name, c.OnRebalance, tc.want)
		}
	}
}
