package main

import (
	"testing"

	"github.com/dreamlake/lakeshore/agent"
)

// TestParseByteSize: sizes with SI and binary units, in any case; a bare
// number is bytes; negative, fractional and overflowing ones are refused.
func TestParseByteSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{in: "0", want: 0},
		{in: "1048576", want: 1 << 20},
		{in: "512B", want: 512},
		{in: "500MB", want: 500e6},
		{in: "500mb", want: 500e6},
		{in: "2GiB", want: 2 << 30},
		{in: "3 kib", want: 3 << 10},
		{in: "1TiB", want: 1 << 40},
		{in: "7kB", want: 7000},
		{in: "", bad: true},
		{in: "-1", bad: true},
		{in: "1.5GiB", bad: true},
		{in: "2G", bad: true},
		{in: "GiB", bad: true},
		{in: "9999999999TiB", bad: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := parseByteSize(tc.in)
			if tc.bad {
				if err == nil {
					t.Fatalf("parseByteSize(%q) = %d, want an error", tc.in, got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseByteSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
		})
	}
}

// TestParseFlagsKeepRuns: --keep-runs and --keep-runs-size (and their
// NYMPH_ variables) default to agent.DefaultKeepRuns and
// agent.DefaultKeepRunsSize; an explicit 0 is 0.
func TestParseFlagsKeepRuns(t *testing.T) {
	required := []string{"--control-plane", "http://127.0.0.1:1", "--enroll-token", "e", "--queue", "q"}
	none := func(string) string { return "" }
	c, _, err := parseFlags(required, none)
	if err != nil {
		t.Fatal(err)
	}
	if c.KeepRuns != agent.DefaultKeepRuns || c.KeepRunsSize != agent.DefaultKeepRunsSize {
		t.Fatalf("unset: keep-runs %s, keep-runs-size %d; want the defaults", c.KeepRuns, c.KeepRunsSize)
	}
	c, _, err = parseFlags(append(required, "--keep-runs", "0s", "--keep-runs-size", "0"), none)
	if err != nil || c.KeepRuns != 0 || c.KeepRunsSize != 0 {
		t.Fatalf("explicit zeros: %s %d %v", c.KeepRuns, c.KeepRunsSize, err)
	}
	env := map[string]string{"NYMPH_KEEP_RUNS": "90m", "NYMPH_KEEP_RUNS_SIZE": "500MB"}
	c, _, err = parseFlags(required, func(k string) string { return env[k] })
	if err != nil || c.KeepRuns.Minutes() != 90 || c.KeepRunsSize != 500e6 {
		t.Fatalf("from the environment: %s %d %v", c.KeepRuns, c.KeepRunsSize, err)
	}
	if _, _, err := parseFlags(append(required, "--keep-runs-size", "lots"), none); err == nil {
		t.Fatal("--keep-runs-size lots accepted")
	}
}
