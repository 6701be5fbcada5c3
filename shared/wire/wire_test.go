package wire_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/hostkey"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Well-formed ids used throughout.
const (
	workerID  = "wrk_01HZY8Q7R6S5T4V3W2X1Y0Z9AB"
	invID     = "inv_01HZY8Q7R6S5T4V3W2X1Y0Z9AC"
	commandID = "cmd_01HZY8Q7R6S5T4V3W2X1Y0Z9AD"
)

func intp(n int) *int { return &n }

var (
	t0 = time.Date(2026, 3, 4, 5, 6, 7, 890000000, time.UTC)
	t1 = t0.Add(90 * time.Second)
	t2 = t0.Add(3 * time.Minute)
)

// roundTrip is one wire type, fully populated, with the JSON names docs/design.md §3
// pins for it.
type roundTrip struct {
	name string
	// value is a pointer to a fully populated value.
	value any
	// keys are the top-level JSON field names value must marshal to.
	keys []string
	// nested checks names inside: a dotted path to an object and its keys.
	nested map[string][]string
}

func roundTrips() []roundTrip {
	return []roundTrip{
		{
			name: "HelloRequest",
			value: &wire.HelloRequest{
				MachineID: "m-1", BootID: "b-1", Label: "gpu box",
				Tags:         map[string]string{"zone": "a"},
				Lanes:        []string{"default", "gpu"},
				Capabilities: wire.Capabilities{MaxConcurrency: intp(4), CurrentInvocations: intp(1)},
				Versions:     map[string]string{"nymph": "1.2.3"},
				HostKey:      hostkey.Of([]string{"apt-get install -y jq"}),
			},
			keys:   []string{"machine_id", "boot_id", "label", "tags", "lanes", "capabilities", "versions", "host_key"},
			nested: map[string][]string{"capabilities": {"max_concurrency", "current_invocations"}},
		},
		{
			name:  "HelloResponse",
			value: &wire.HelloResponse{WorkerID: workerID, Token: "wtk_x_y", StaleAfterS: 3, PollIntervalS: 0.5},
			keys:  []string{"worker_id", "token", "stale_after_s", "poll_interval_s"},
		},
		{
			name: "PollRequest",
			value: &wire.PollRequest{
				WorkerID: workerID, Queue: "default", TimeoutS: 2.5, Invocations: []string{invID},
				Phase: wire.PhaseReady, HostKey: hostkey.Of([]string{"true"}),
				UpdatedCapabilities: &wire.Capabilities{CurrentInvocations: intp(0), MaxConcurrency: intp(2)},
				SetupResults: []wire.SetupResult{{
					CommandID: commandID, Status: wire.SetupFailed, ExitCode: 2, DurationMS: 1500, OutputTail: "boom",
				}},
			},
			keys: []string{"worker_id", "queue", "timeout_s", "invocations", "phase", "host_key", "updated_capabilities", "setup_results"},
			nested: map[string][]string{
				"updated_capabilities": {"max_concurrency", "current_invocations"},
				"setup_results.0":      {"command_id", "status", "exit_code", "duration_ms", "output_tail"},
			},
		},
		{
			name: "PollResponse",
			value: &wire.PollResponse{Commands: []wire.Command{
				{Type: wire.CommandRun, Invocation: &wire.RunInvocation{
					InvocationID: invID, Attempt: 2, Argv: []string{"echo", "hi"},
					Env: map[string]string{"A": "1"},
					RunConfig: wire.RunConfig{
						HostSetup: []string{"make deps"}, RunSetup: []string{"cp a b"},
						Env: map[string]string{"B": "2"}, Workdir: "sub",
					},
					TimeoutS: 30, HostKey: hostkey.Of([]string{"make deps"}),
				}},
				{Type: wire.CommandSetup, CommandID: commandID, Argv: []string{"sh", "-c", "true"}},
				{Type: wire.CommandCancel, InvocationID: invID},
				{Type: wire.CommandDrain},
			}},
			keys: []string{"commands"},
			nested: map[string][]string{
				"commands.0":                       {"type", "invocation"},
				"commands.0.invocation":            {"invocation_id", "attempt", "argv", "env", "run_config", "timeout_s", "host_key"},
				"commands.0.invocation.run_config": {"host_setup", "run_setup", "env", "workdir"},
				"commands.1":                       {"type", "command_id", "argv"},
				"commands.2":                       {"type", "invocation_id"},
				"commands.3":                       {"type"},
			},
		},
		{
			name: "AckRequest",
			value: &wire.AckRequest{
				WorkerID: workerID, InvocationID: invID, Attempt: 1, State: wire.StateFailed,
				ExitCode: intp(3), ResultBlob: json.RawMessage(`{"rows":[1,2]}`),
				Error:      &wire.ErrorInfo{Type: "exit", Message: "exit status 3"},
				StdoutTail: "out", StderrTail: "err", Phase: wire.PhaseDraining,
			},
			keys:   []string{"worker_id", "invocation_id", "attempt", "state", "exit_code", "result_blob", "error", "stdout_tail", "stderr_tail", "phase"},
			nested: map[string][]string{"error": {"type", "message"}},
		},
		{
			name:  "AckResponse",
			value: &wire.AckResponse{Recorded: true, State: wire.StateSucceeded},
			keys:  []string{"recorded", "state"},
		},
		{
			name:  "ByeRequest",
			value: &wire.ByeRequest{WorkerID: workerID, Reason: wire.ByeSpotInterruption, InflightAbandoned: 2},
			keys:  []string{"worker_id", "reason", "inflight_abandoned"},
		},
		{
			name: "SubmitRequest",
			value: &wire.SubmitRequest{
				Queue: "default", Argv: []string{"python", "job.py"}, Env: map[string]string{"X": "y"},
				RunConfig: wire.RunConfig{HostSetup: []string{"pip install x"}, RunSetup: []string{"mkdir out"},
					Env: map[string]string{"Z": "1"}, Workdir: "w"},
				TimeoutS: 600, MaxAttempts: 5, IdempotencyKey: "batch-7/item-3",
			},
			keys:   []string{"queue", "argv", "env", "run_config", "timeout_s", "max_attempts", "idempotency_key"},
			nested: map[string][]string{"run_config": {"host_setup", "run_setup", "env", "workdir"}},
		},
		{
			name: "Invocation",
			value: &wire.Invocation{
				InvocationID: invID, Queue: "default", State: wire.StateSucceeded, Attempt: 2, MaxAttempts: 3,
				WorkerID: workerID, Argv: []string{"true"}, Env: map[string]string{"A": "b"},
				RunConfig: wire.RunConfig{Workdir: "w"}, TimeoutS: 10, ExitCode: intp(0),
				ResultBlob: json.RawMessage(`[1,"two",null]`), Error: &wire.ErrorInfo{Type: "none"},
				StdoutTail: "o", StderrTail: "e", HostKey: hostkey.Of([]string{"x"}), CancelRequested: true,
				IdempotencyKey: "k", CreatedAt: t0, StartedAt: &t1, FinishedAt: &t2,
			},
			keys: []string{"invocation_id", "queue", "state", "attempt", "max_attempts", "worker_id", "argv", "env",
				"run_config", "timeout_s", "exit_code", "result_blob", "error", "stdout_tail", "stderr_tail", "host_key",
				"cancel_requested", "idempotency_key", "created_at", "started_at", "finished_at"},
		},
		{
			name: "InvocationList",
			value: &wire.InvocationList{
				Invocations: []wire.Invocation{{InvocationID: invID, Queue: "q", State: wire.StateQueued, Argv: []string{"a"}, CreatedAt: t0}},
				NextCursor:  "abc",
			},
			keys: []string{"invocations", "next_cursor"},
		},
		{
			name: "Worker",
			value: &wire.Worker{
				WorkerID: workerID, MachineID: "m", Label: "l", State: "stale", StoredState: "active",
				HostStatus: "running", Phase: wire.PhaseReady, HostKey: hostkey.Of([]string{"y"}),
				Tags: map[string]string{"k": "v"}, Lanes: []string{"default"}, MaxConcurrency: 4, CurrentInvocations: 1,
				LastSeenAt: &t1, CreatedAt: t0, RetiredWhy: "bye: idle",
				LastSetupResult: &wire.SetupResult{CommandID: commandID, Status: wire.SetupSucceeded, ExitCode: 0, DurationMS: 12},
			},
			keys: []string{"worker_id", "machine_id", "label", "state", "stored_state", "host_status", "phase", "host_key",
				"tags", "lanes", "max_concurrency", "current_invocations", "last_seen_at", "created_at", "bye_reason", "last_setup_result"},
			nested: map[string][]string{"last_setup_result": {"command_id", "status", "exit_code", "duration_ms"}},
		},
		{
			name:  "WorkerList",
			value: &wire.WorkerList{Workers: []wire.Worker{{WorkerID: workerID, MachineID: "m", State: "active", CreatedAt: t0}}, NextCursor: "n"},
			keys:  []string{"workers", "next_cursor"},
		},
		{
			name:  "SetupRequest",
			value: &wire.SetupRequest{Argv: []string{"sh", "-c", "echo hi"}},
			keys:  []string{"argv"},
		},
		{
			name:  "SetupAccepted",
			value: &wire.SetupAccepted{CommandID: commandID},
			keys:  []string{"command_id"},
		},
		{
			name: "SetupResults",
			value: &wire.SetupResults{WorkerID: workerID, SetupResults: []wire.SetupCommand{
				{CommandID: commandID, Argv: []string{"x"}, Status: wire.SetupFailed, ExitCode: intp(1), DurationMS: 5,
					OutputTail: "no", CreatedAt: t0, FinishedAt: &t1},
			}},
			keys: []string{"worker_id", "setup_results"},
			nested: map[string][]string{
				"setup_results.0": {"command_id", "argv", "status", "exit_code", "duration_ms", "output_tail", "created_at", "finished_at"},
			},
		},
		{
			name:  "DrainAccepted",
			value: &wire.DrainAccepted{WorkerID: workerID, State: "draining"},
			keys:  []string{"worker_id", "state"},
		},
		{
			name:  "QueueStats",
			value: &wire.QueueStats{Queue: "q", Counts: map[string]int{"queued": 1, "succeeded": 2}, DoneCount: 2},
			keys:  []string{"queue", "counts", "done_count"},
		},
		{
			name:  "Health",
			value: &wire.Health{Status: "ok"},
			keys:  []string{"status"},
		},
		{
			name:  "ErrorBody",
			value: &wire.ErrorBody{Error: wire.ErrorDetail{Code: wire.CodeConflict, Message: "no"}},
			keys:  []string{"error"},
			nested: map[string][]string{
				"error": {"code", "message"},
			},
		},
	}
}

// newOf returns a pointer to a new zero value of the type v points to.
func newOf(v any) any { return reflect.New(reflect.TypeOf(v).Elem()).Interface() }

// lookup walks a dotted path (object keys and list indexes) in decoded JSON.
func lookup(t *testing.T, doc any, path string) map[string]any {
	t.Helper()
	cur := doc
	for _, part := range strings.Split(path, ".") {
		switch c := cur.(type) {
		case map[string]any:
			cur = c[part]
		case []any:
			var i int
			if _, err := fmt.Sscan(part, &i); err != nil || i >= len(c) {
				t.Fatalf("path %q: bad index %q", path, part)
			}
			cur = c[i]
		default:
			t.Fatalf("path %q: %q is inside a %T", path, part, cur)
		}
	}
	m, ok := cur.(map[string]any)
	if !ok {
		t.Fatalf("path %q is a %T, not an object", path, cur)
	}
	return m
}

func sortedKeys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }

func TestJSONRoundTrip(t *testing.T) {
	for _, tc := range roundTrips() {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.value)
			if err != nil {
				t.Fatalf("marshal: %v", err)
			}
			var doc any
			if err := json.Unmarshal(b, &doc); err != nil {
				t.Fatalf("unmarshal to any: %v", err)
			}
			top := doc.(map[string]any)
			if got, want := sortedKeys(top), slices.Sorted(slices.Values(tc.keys)); !slices.Equal(got, want) {
				t.Errorf("JSON names\n got %v\nwant %v\njson %s", got, want, b)
			}
			for path, want := range tc.nested {
				if got := sortedKeys(lookup(t, doc, path)); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
					t.Errorf("JSON names at %s\n got %v\nwant %v", path, got, slices.Sorted(slices.Values(want)))
				}
			}

			back := newOf(tc.value)
			if err := json.Unmarshal(b, back); err != nil {
				t.Fatalf("unmarshal: %v", err)
			}
			if !reflect.DeepEqual(back, tc.value) {
				t.Errorf("round trip changed the value\n got %+v\nwant %+v", back, tc.value)
			}
		})
	}
}

// TestTimestampsAreRFC3339UTC pins the timestamp form of docs/design.md §3.
func TestTimestampsAreRFC3339UTC(t *testing.T) {
	b, err := json.Marshal(wire.Invocation{CreatedAt: t0, StartedAt: &t1})
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"created_at", "started_at"} {
		s, _ := m[k].(string)
		if _, err := time.Parse(time.RFC3339, s); err != nil || !strings.HasSuffix(s, "Z") {
			t.Errorf("%s = %q, want RFC 3339 in UTC (Z)", k, s)
		}
	}
}

func TestJSONUnknownFieldsIgnored(t *testing.T) {
	for _, tc := range roundTrips() {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.value)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			m["from_the_future"] = map[string]any{"x": []int{1, 2}}
			m["another_new_field"] = "v2"
			b2, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			back := newOf(tc.value)
			if err := json.Unmarshal(b2, back); err != nil {
				t.Fatalf("unmarshal with unknown fields: %v", err)
			}
			if !reflect.DeepEqual(back, tc.value) {
				t.Errorf("unknown fields changed the value\n got %+v\nwant %+v", back, tc.value)
			}
		})
	}
}

func TestJSONOmittedFieldsDecodeToZero(t *testing.T) {
	for _, tc := range roundTrips() {
		t.Run(tc.name, func(t *testing.T) {
			back := newOf(tc.value)
			if err := json.Unmarshal([]byte(`{}`), back); err != nil {
				t.Fatalf("unmarshal {}: %v", err)
			}
			if zero := newOf(tc.value); !reflect.DeepEqual(back, zero) {
				t.Errorf("{} decoded to %+v, want the zero value", back)
			}
		})
	}
}

// TestJSONOptionalFieldsOmitted checks that an old peer sees none of the
// optional fields a minimal message does not set.
func TestJSONOptionalFieldsOmitted(t *testing.T) {
	cases := []struct {
		name  string
		value any
		want  string
	}{
		{"minimal hello", wire.HelloRequest{MachineID: "m", BootID: "b"}, `{"machine_id":"m","boot_id":"b","capabilities":{}}`},
		{"minimal poll", wire.PollRequest{WorkerID: workerID}, `{"worker_id":"` + workerID + `"}`},
		{"empty poll answer", wire.PollResponse{Commands: []wire.Command{}}, `{"commands":[]}`},
		{"drain command", wire.Command{Type: wire.CommandDrain}, `{"type":"drain"}`},
		{"host setup result", wire.SetupResult{Command: "exit 3", Status: wire.SetupFailed, ExitCode: 3}, `{"command":"exit 3","status":"failed","exit_code":3,"duration_ms":0}`},
		{"cancel command", wire.Command{Type: wire.CommandCancel, InvocationID: invID, Reason: wire.CancelOperator}, `{"type":"cancel","invocation_id":"` + invID + `","reason":"operator"}`},
		{"ack without outcome details", wire.AckRequest{WorkerID: workerID, InvocationID: invID, Attempt: 1, State: wire.StateSucceeded},
			`{"worker_id":"` + workerID + `","invocation_id":"` + invID + `","attempt":1,"state":"succeeded"}`},
		{"exit code zero is sent", wire.AckRequest{ExitCode: intp(0)}, `{"worker_id":"","invocation_id":"","attempt":0,"state":"","exit_code":0}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.value)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Errorf("got  %s\nwant %s", b, tc.want)
			}
		})
	}
}

// --- Decode and Validate ---

func rep(s string, n int) string { return strings.Repeat(s, n) }

// js renders v as JSON.
func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// with returns JSON for base with field set to v (v is any JSON-able value),
// so a case names only the field it breaks.
func with(base any, field string, v any) string {
	var m map[string]any
	if err := json.Unmarshal([]byte(js(base)), &m); err != nil {
		panic(err)
	}
	m[field] = v
	return js(m)
}

// without returns JSON for base with field removed.
func without(base any, field string) string {
	var m map[string]any
	if err := json.Unmarshal([]byte(js(base)), &m); err != nil {
		panic(err)
	}
	delete(m, field)
	return js(m)
}

func strMap(n int, keyPrefix string, value string) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m[fmt.Sprintf("%s%04d", keyPrefix, i)] = value
	}
	return m
}

func strList(n int, s string) []string {
	l := make([]string, n)
	for i := range l {
		l[i] = s
	}
	return l
}

func idList(n int) []string {
	l := make([]string, n)
	for i := range l {
		l[i] = invID
	}
	return l
}

func setupResults(n int) []wire.SetupResult {
	l := make([]wire.SetupResult, n)
	for i := range l {
		l[i] = wire.SetupResult{CommandID: commandID, Status: wire.SetupSucceeded}
	}
	return l
}

// Minimal valid requests.
var (
	okHello  = wire.HelloRequest{MachineID: "m-1", BootID: "b-1"}
	okPoll   = wire.PollRequest{WorkerID: workerID}
	okAck    = wire.AckRequest{WorkerID: workerID, InvocationID: invID, Attempt: 1, State: wire.StateSucceeded}
	okBye    = wire.ByeRequest{WorkerID: workerID, Reason: wire.ByeIdle}
	okSubmit = wire.SubmitRequest{Queue: "default", Argv: []string{"true"}}
	okSetup  = wire.SetupRequest{Argv: []string{"true"}}
)

type decodeCase struct {
	name string
	body string
	// want is "" for accepted, else the code of the refusal.
	want wire.Code
	// check, if set, inspects the decoded value of an accepted body.
	check func(t *testing.T, v wire.Validator)
}

// sizedBody returns a submit body of exactly n bytes (JSON padded with
// trailing whitespace, which Decode allows).
func sizedBody(n int) string {
	b := js(okSubmit)
	return b + rep(" ", n-len(b))
}

// jsonString returns a JSON string literal whose encoding is exactly n bytes.
func jsonString(n int) string { return `"` + rep("x", n-2) + `"` }

func TestDecode(t *testing.T) {
	hostKey := hostkey.Of([]string{"apt-get install -y jq"})
	suites := []struct {
		name  string
		new   func() wire.Validator
		cases []decodeCase
	}{
		{"body", func() wire.Validator { return &wire.SubmitRequest{} }, []decodeCase{
			{name: "body at the limit", body: sizedBody(wire.MaxBodyBytes)},
			{name: "body one byte over the limit", body: sizedBody(wire.MaxBodyBytes + 1), want: wire.CodeTooLarge},
			{name: "body far over the limit", body: sizedBody(4 * wire.MaxBodyBytes), want: wire.CodeTooLarge},
			{name: "empty", body: "", want: wire.CodeInvalid},
			{name: "whitespace only", body: "  \n", want: wire.CodeInvalid},
			{name: "not JSON", body: "queue=default&argv=true", want: wire.CodeInvalid},
			{name: "truncated", body: `{"queue":"default","argv":["tr`, want: wire.CodeInvalid},
			{name: "trailing object", body: js(okSubmit) + `{}`, want: wire.CodeInvalid},
			{name: "trailing garbage", body: js(okSubmit) + ` x`, want: wire.CodeInvalid},
			{name: "two values", body: js(okSubmit) + "\n" + js(okSubmit), want: wire.CodeInvalid},
			{name: "trailing whitespace", body: js(okSubmit) + " \n\t"},
			{name: "invalid UTF-8 in a string", body: "{\"queue\":\"default\",\"argv\":[\"\xff\xfe\"]}", want: wire.CodeInvalid},
			{name: "invalid UTF-8 outside strings", body: js(okSubmit) + "\xc3", want: wire.CodeInvalid},
			{name: "array instead of object", body: `[]`, want: wire.CodeInvalid},
			{name: "string instead of object", body: `"hi"`, want: wire.CodeInvalid},
			{name: "null body", body: `null`, want: wire.CodeInvalid}, // required fields missing
			{name: "wrong type: queue number", body: with(okSubmit, "queue", 5), want: wire.CodeInvalid},
			{name: "wrong type: argv string", body: with(okSubmit, "argv", "true"), want: wire.CodeInvalid},
			{name: "wrong type: argv of numbers", body: with(okSubmit, "argv", []int{1}), want: wire.CodeInvalid},
			{name: "wrong type: env list", body: with(okSubmit, "env", []string{"A=1"}), want: wire.CodeInvalid},
			{name: "wrong type: timeout_s string", body: with(okSubmit, "timeout_s", "10"), want: wire.CodeInvalid},
			{name: "wrong type: timeout_s fraction", body: with(okSubmit, "timeout_s", 1.5), want: wire.CodeInvalid},
			{name: "unknown fields ignored", body: with(okSubmit, "priority", map[string]any{"x": 1})},
			{name: "workdir relative", body: with(okSubmit, "run_config", map[string]any{"workdir": "src/app"})},
			{name: "workdir absolute", body: with(okSubmit, "run_config", map[string]any{"workdir": "/etc"}), want: wire.CodeInvalid},
			{name: "workdir climbing out", body: with(okSubmit, "run_config", map[string]any{"workdir": "a/../../b"}), want: wire.CodeInvalid},
			{name: "workdir dot-dot", body: with(okSubmit, "run_config", map[string]any{"workdir": ".."}), want: wire.CodeInvalid},
		}},
		{"hello", func() wire.Validator { return &wire.HelloRequest{} }, []decodeCase{
			{name: "minimal", body: js(okHello)},
			{name: "full", body: js(wire.HelloRequest{MachineID: "m", BootID: "b", Label: "l", Tags: map[string]string{"a": "b"},
				Lanes: []string{"default"}, Capabilities: wire.Capabilities{MaxConcurrency: intp(2), CurrentInvocations: intp(0)},
				Versions: map[string]string{"nymph": "1"}, HostKey: hostKey})},
			{name: "missing machine_id", body: without(okHello, "machine_id"), want: wire.CodeInvalid},
			{name: "missing boot_id", body: without(okHello, "boot_id"), want: wire.CodeInvalid},
			{name: "machine_id at limit", body: with(okHello, "machine_id", rep("m", wire.MaxIDLen))},
			{name: "machine_id over limit", body: with(okHello, "machine_id", rep("m", wire.MaxIDLen+1)), want: wire.CodeInvalid},
			{name: "boot_id at limit", body: with(okHello, "boot_id", rep("b", wire.MaxIDLen))},
			{name: "boot_id over limit", body: with(okHello, "boot_id", rep("b", wire.MaxIDLen+1)), want: wire.CodeInvalid},
			{name: "label at limit", body: with(okHello, "label", rep("l", wire.MaxLabelLen))},
			{name: "label over limit", body: with(okHello, "label", rep("l", wire.MaxLabelLen+1)), want: wire.CodeInvalid},
			{name: "tags at limit", body: with(okHello, "tags", strMap(wire.MaxTags, "k", "v"))},
			{name: "tags over limit", body: with(okHello, "tags", strMap(wire.MaxTags+1, "k", "v")), want: wire.CodeInvalid},
			{name: "tag empty key", body: with(okHello, "tags", map[string]string{"": "v"}), want: wire.CodeInvalid},
			{name: "tag key at limit", body: with(okHello, "tags", map[string]string{rep("k", wire.MaxTagBytes): "v"})},
			{name: "tag key over limit", body: with(okHello, "tags", map[string]string{rep("k", wire.MaxTagBytes+1): "v"}), want: wire.CodeInvalid},
			{name: "tag value at limit", body: with(okHello, "tags", map[string]string{"k": rep("v", wire.MaxTagBytes)})},
			{name: "tag value over limit", body: with(okHello, "tags", map[string]string{"k": rep("v", wire.MaxTagBytes+1)}), want: wire.CodeInvalid},
			{name: "lanes at limit", body: with(okHello, "lanes", strList(wire.MaxLanes, "q"))},
			{name: "lanes over limit", body: with(okHello, "lanes", strList(wire.MaxLanes+1, "q")), want: wire.CodeInvalid},
			{name: "lane empty", body: with(okHello, "lanes", []string{""}), want: wire.CodeInvalid},
			{name: "lane with space", body: with(okHello, "lanes", []string{"a b"}), want: wire.CodeInvalid},
			{name: "lane with #", body: with(okHello, "lanes", []string{"a#b"}), want: wire.CodeInvalid},
			{name: "lane name at limit", body: with(okHello, "lanes", []string{rep("q", wire.MaxQueueLen)})},
			{name: "lane name over limit", body: with(okHello, "lanes", []string{rep("q", wire.MaxQueueLen+1)}), want: wire.CodeInvalid},
			{name: "versions at limit", body: with(okHello, "versions", strMap(wire.MaxTags, "v", "1"))},
			{name: "versions over limit", body: with(okHello, "versions", strMap(wire.MaxTags+1, "v", "1")), want: wire.CodeInvalid},
			// Found by FuzzHello: DynamoDB refuses an empty map key, so
			// this reached the store and came back as a 500.
			{name: "version empty key", body: with(okHello, "versions", map[string]string{"": ""}), want: wire.CodeInvalid},
			{name: "version key over limit", body: with(okHello, "versions", map[string]string{rep("k", wire.MaxTagBytes+1): "1"}), want: wire.CodeInvalid},
			{name: "version value over limit", body: with(okHello, "versions", map[string]string{"k": rep("v", wire.MaxTagBytes+1)}), want: wire.CodeInvalid},
			{name: "max_concurrency 0", body: with(okHello, "capabilities", map[string]int{"max_concurrency": 0}), want: wire.CodeInvalid},
			{name: "max_concurrency -1", body: with(okHello, "capabilities", map[string]int{"max_concurrency": -1}), want: wire.CodeInvalid},
			{name: "max_concurrency 1", body: with(okHello, "capabilities", map[string]int{"max_concurrency": 1})},
			{name: "max_concurrency at limit", body: with(okHello, "capabilities", map[string]int{"max_concurrency": wire.MaxConcurrency})},
			{name: "max_concurrency over limit", body: with(okHello, "capabilities", map[string]int{"max_concurrency": wire.MaxConcurrency + 1}), want: wire.CodeInvalid},
			{name: "max_concurrency fraction", body: with(okHello, "capabilities", map[string]float64{"max_concurrency": 1.5}), want: wire.CodeInvalid},
			{name: "current_invocations -1", body: with(okHello, "capabilities", map[string]int{"current_invocations": -1}), want: wire.CodeInvalid},
			{name: "current_invocations at limit", body: with(okHello, "capabilities", map[string]int{"current_invocations": wire.MaxConcurrency})},
			{name: "current_invocations over limit", body: with(okHello, "capabilities", map[string]int{"current_invocations": wire.MaxConcurrency + 1}), want: wire.CodeInvalid},
			{name: "host_key valid", body: with(okHello, "host_key", hostKey)},
			{name: "host_key wrong prefix", body: with(okHello, "host_key", "hk2_"+hostKey[4:]), want: wire.CodeInvalid},
			{name: "host_key short", body: with(okHello, "host_key", hostKey[:len(hostKey)-1]), want: wire.CodeInvalid},
			{name: "host_key long", body: with(okHello, "host_key", hostKey+"0"), want: wire.CodeInvalid},
			{name: "host_key upper-case hex", body: with(okHello, "host_key", "hk1_"+strings.ToUpper(hostKey[4:])), want: wire.CodeInvalid},
			{name: "host_key not hex", body: with(okHello, "host_key", "hk1_"+rep("g", 64)), want: wire.CodeInvalid},
		}},
		{"poll", func() wire.Validator { return &wire.PollRequest{} }, []decodeCase{
			{name: "minimal", body: js(okPoll)},
			{name: "missing worker_id", body: `{}`, want: wire.CodeInvalid},
			{name: "worker_id wrong prefix", body: with(okPoll, "worker_id", "inv_"+workerID[4:]), want: wire.CodeInvalid},
			{name: "worker_id no prefix", body: with(okPoll, "worker_id", workerID[4:]), want: wire.CodeInvalid},
			{name: "worker_id lower-case", body: with(okPoll, "worker_id", strings.ToLower(workerID)), want: wire.CodeInvalid},
			{name: "worker_id bad ULID", body: with(okPoll, "worker_id", "wrk_NOTAULID"), want: wire.CodeInvalid},
			{name: "worker_id ULID with I", body: with(okPoll, "worker_id", "wrk_01HZY8Q7R6S5T4V3W2X1Y0Z9AI"), want: wire.CodeInvalid},
			{name: "worker_id trailing space", body: with(okPoll, "worker_id", workerID+" "), want: wire.CodeInvalid},
			{name: "worker_id number", body: with(okPoll, "worker_id", 7), want: wire.CodeInvalid},
			{name: "queue at limit", body: with(okPoll, "queue", rep("q", wire.MaxQueueLen))},
			{name: "queue over limit", body: with(okPoll, "queue", rep("q", wire.MaxQueueLen+1)), want: wire.CodeInvalid},
			{name: "queue with slash", body: with(okPoll, "queue", "a/b"), want: wire.CodeInvalid},
			{name: "timeout_s 0", body: with(okPoll, "timeout_s", 0)},
			{name: "timeout_s fractional", body: with(okPoll, "timeout_s", 0.25)},
			{name: "timeout_s 3600", body: with(okPoll, "timeout_s", 3600)},
			{name: "timeout_s over 3600", body: with(okPoll, "timeout_s", 3600.001), want: wire.CodeInvalid},
			{name: "timeout_s negative", body: with(okPoll, "timeout_s", -1), want: wire.CodeInvalid},
			{name: "timeout_s tiny negative", body: with(okPoll, "timeout_s", -1e-9), want: wire.CodeInvalid},
			{name: "timeout_s NaN string", body: with(okPoll, "timeout_s", "NaN"), want: wire.CodeInvalid},
			{name: "timeout_s NaN literal", body: `{"worker_id":"` + workerID + `","timeout_s":NaN}`, want: wire.CodeInvalid},
			{name: "timeout_s Infinity literal", body: `{"worker_id":"` + workerID + `","timeout_s":Infinity}`, want: wire.CodeInvalid},
			{name: "timeout_s overflows float64", body: `{"worker_id":"` + workerID + `","timeout_s":1e400}`, want: wire.CodeInvalid},
			{name: "invocations at limit", body: with(okPoll, "invocations", idList(wire.MaxInflightIDs))},
			{name: "invocations over limit", body: with(okPoll, "invocations", idList(wire.MaxInflightIDs+1)), want: wire.CodeInvalid},
			{name: "invocations bad id", body: with(okPoll, "invocations", []string{invID, "inv_nope"}), want: wire.CodeInvalid},
			{name: "invocations worker id", body: with(okPoll, "invocations", []string{workerID}), want: wire.CodeInvalid},
			{name: "invocations empty id", body: with(okPoll, "invocations", []string{""}), want: wire.CodeInvalid},
			{name: "phase setup", body: with(okPoll, "phase", wire.PhaseSetup)},
			{name: "phase ready", body: with(okPoll, "phase", wire.PhaseReady)},
			{name: "phase draining", body: with(okPoll, "phase", wire.PhaseDraining)},
			{name: "phase terminating", body: with(okPoll, "phase", wire.PhaseTerminating)},
			{name: "phase booting is never sent", body: with(okPoll, "phase", wire.PhaseBooting), want: wire.CodeInvalid},
			{name: "phase upper-case", body: with(okPoll, "phase", "READY"), want: wire.CodeInvalid},
			{name: "phase unknown", body: with(okPoll, "phase", "sleeping"), want: wire.CodeInvalid},
			{name: "host_key valid", body: with(okPoll, "host_key", hostKey)},
			{name: "host_key bad", body: with(okPoll, "host_key", "hk1_xyz"), want: wire.CodeInvalid},
			{name: "updated max_concurrency 0", body: with(okPoll, "updated_capabilities", map[string]int{"max_concurrency": 0}), want: wire.CodeInvalid},
			{name: "updated max_concurrency over limit", body: with(okPoll, "updated_capabilities", map[string]int{"max_concurrency": wire.MaxConcurrency + 1}), want: wire.CodeInvalid},
			{name: "updated current_invocations -1", body: with(okPoll, "updated_capabilities", map[string]int{"current_invocations": -1}), want: wire.CodeInvalid},
			{name: "updated current_invocations 0", body: with(okPoll, "updated_capabilities", map[string]int{"current_invocations": 0}),
				check: func(t *testing.T, v wire.Validator) {
					c := v.(*wire.PollRequest).UpdatedCapabilities
					if c == nil || c.CurrentInvocations == nil || *c.CurrentInvocations != 0 || c.MaxConcurrency != nil {
						t.Errorf("updated_capabilities = %+v, want current_invocations 0 set and max_concurrency unset", c)
					}
				}},
			{name: "setup_results at limit", body: with(okPoll, "setup_results", setupResults(wire.MaxSetupResults))},
			{name: "setup_results over limit", body: with(okPoll, "setup_results", setupResults(wire.MaxSetupResults+1)), want: wire.CodeInvalid},
			{name: "setup result missing command_id", body: with(okPoll, "setup_results", []map[string]any{{"status": "succeeded"}}), want: wire.CodeInvalid},
			{name: "setup result invocation id", body: with(okPoll, "setup_results", []map[string]any{{"command_id": invID, "status": "succeeded"}}), want: wire.CodeInvalid},
			{name: "setup result status failed", body: with(okPoll, "setup_results", []map[string]any{{"command_id": commandID, "status": "failed", "exit_code": 1}})},
			{name: "setup result status pending", body: with(okPoll, "setup_results", []map[string]any{{"command_id": commandID, "status": "pending"}}), want: wire.CodeInvalid},
			{name: "setup result status missing", body: with(okPoll, "setup_results", []map[string]any{{"command_id": commandID}}), want: wire.CodeInvalid},
			{name: "setup result status unknown", body: with(okPoll, "setup_results", []map[string]any{{"command_id": commandID, "status": "ok"}}), want: wire.CodeInvalid},
			{name: "setup result output_tail at limit", body: with(okPoll, "setup_results", []map[string]any{{"command_id": commandID, "status": "succeeded", "output_tail": rep("o", wire.MaxTailBytes)}})},
			{name: "setup result output_tail over limit", body: with(okPoll, "setup_results", []map[string]any{{"command_id": commandID, "status": "succeeded", "output_tail": rep("o", wire.MaxTailBytes+1)}}), want: wire.CodeInvalid},
			{name: "setup result duration_ms negative", body: with(okPoll, "setup_results", []map[string]any{{"command_id": commandID, "status": "succeeded", "duration_ms": -1}}), want: wire.CodeInvalid},
			{name: "host setup result without command_id", body: with(okPoll, "setup_results", []map[string]any{{"command": "exit 3", "status": "failed", "exit_code": 3}}),
				check: func(t *testing.T, v wire.Validator) {
					if r := v.(*wire.PollRequest).SetupResults; len(r) != 1 || r[0].Command != "exit 3" || r[0].CommandID != "" {
						t.Errorf("setup_results = %+v, want one host-setup result", r)
					}
				}},
			{name: "host setup result empty command", body: with(okPoll, "setup_results", []map[string]any{{"command": "", "status": "failed"}}), want: wire.CodeInvalid},
			{name: "host setup result bad command_id", body: with(okPoll, "setup_results", []map[string]any{{"command_id": "cmd_x", "command": "true", "status": "succeeded"}}), want: wire.CodeInvalid},
			{name: "setup result command at limit", body: with(okPoll, "setup_results", []map[string]any{{"command": rep("c", wire.MaxSetupTextBytes), "status": "succeeded"}})},
			{name: "setup result command over limit", body: with(okPoll, "setup_results", []map[string]any{{"command": rep("c", wire.MaxSetupTextBytes+1), "status": "succeeded"}}), want: wire.CodeInvalid},
		}},
		{"ack", func() wire.Validator { return &wire.AckRequest{} }, []decodeCase{
			{name: "minimal", body: js(okAck)},
			{name: "missing worker_id", body: without(okAck, "worker_id"), want: wire.CodeInvalid},
			{name: "missing invocation_id", body: without(okAck, "invocation_id"), want: wire.CodeInvalid},
			{name: "invocation_id wrong prefix", body: with(okAck, "invocation_id", "cmd_"+invID[4:]), want: wire.CodeInvalid},
			{name: "invocation_id lower-case", body: with(okAck, "invocation_id", "inv_"+strings.ToLower(invID[4:])), want: wire.CodeInvalid},
			{name: "worker_id is an invocation id", body: with(okAck, "worker_id", invID), want: wire.CodeInvalid},
			{name: "attempt missing", body: without(okAck, "attempt"), want: wire.CodeInvalid},
			{name: "attempt 0", body: with(okAck, "attempt", 0), want: wire.CodeInvalid},
			{name: "attempt -1", body: with(okAck, "attempt", -1), want: wire.CodeInvalid},
			// Attempts given back and reruns take an invocation past max_attempts.
			{name: "attempt past max_attempts' limit", body: with(okAck, "attempt", wire.MaxAttemptsLimit+1)},
			{name: "attempt at limit", body: with(okAck, "attempt", wire.MaxAttemptNumber)},
			{name: "attempt over limit", body: with(okAck, "attempt", wire.MaxAttemptNumber+1), want: wire.CodeInvalid},
			{name: "state succeeded", body: with(okAck, "state", wire.StateSucceeded)},
			{name: "state failed", body: with(okAck, "state", wire.StateFailed)},
			{name: "state cancelled", body: with(okAck, "state", wire.StateCancelled)},
			{name: "state queued", body: with(okAck, "state", wire.StateQueued), want: wire.CodeInvalid},
			{name: "state running", body: with(okAck, "state", wire.StateRunning), want: wire.CodeInvalid},
			{name: "state missing", body: without(okAck, "state"), want: wire.CodeInvalid},
			{name: "state upper-case", body: with(okAck, "state", "SUCCEEDED"), want: wire.CodeInvalid},
			{name: "state requeued", body: with(okAck, "state", wire.AckRequeued)},
			{name: "no phase (an older daemon)", body: js(okAck),
				check: func(t *testing.T, v wire.Validator) {
					if o := v.(*wire.AckRequest).Outcome(); o.Phase != "" {
						t.Errorf("outcome phase %q, want none", o.Phase)
					}
				}},
			{name: "phase setup", body: with(okAck, "phase", wire.PhaseSetup)},
			{name: "phase ready", body: with(okAck, "phase", wire.PhaseReady)},
			{name: "phase terminating", body: with(okAck, "phase", wire.PhaseTerminating)},
			{name: "phase draining", body: with(wire.AckRequest{WorkerID: workerID, InvocationID: invID, Attempt: 1, State: wire.AckRequeued}, "phase", wire.PhaseDraining),
				check: func(t *testing.T, v wire.Validator) {
					if o := v.(*wire.AckRequest).Outcome(); o.Phase != domain.PhaseDraining || o.State != domain.AckRequeued {
						t.Errorf("outcome %+v, want requeued in phase draining", o)
					}
				}},
			{name: "phase booting (never sent)", body: with(okAck, "phase", wire.PhaseBooting), want: wire.CodeInvalid},
			{name: "phase unknown", body: with(okAck, "phase", "sleeping"), want: wire.CodeInvalid},
			{name: "phase upper-case", body: with(okAck, "phase", "DRAINING"), want: wire.CodeInvalid},
			{name: "phase not a string", body: with(okAck, "phase", 3), want: wire.CodeInvalid},
			{name: "negative exit code", body: with(okAck, "exit_code", -9)},
			{name: "result_blob at limit", body: with(okAck, "result_blob", json.RawMessage(jsonString(wire.MaxResultBlobBytes)))},
			{name: "result_blob over limit", body: with(okAck, "result_blob", json.RawMessage(jsonString(wire.MaxResultBlobBytes+1))), want: wire.CodeInvalid},
			{name: "result_blob object", body: with(okAck, "result_blob", map[string]any{"rows": 3}),
				check: func(t *testing.T, v wire.Validator) {
					if got := string(v.(*wire.AckRequest).ResultBlob); got != `{"rows":3}` {
						t.Errorf("result_blob = %s", got)
					}
				}},
			{name: "result_blob not JSON", body: `{"worker_id":"` + workerID + `","invocation_id":"` + invID + `","attempt":1,"state":"succeeded","result_blob":nope}`, want: wire.CodeInvalid},
			{name: "error with type", body: with(okAck, "error", map[string]string{"type": "exit", "message": "boom"})},
			{name: "error without type", body: with(okAck, "error", map[string]string{"message": "boom"}), want: wire.CodeInvalid},
			{name: "error type at limit", body: with(okAck, "error", map[string]string{"type": rep("t", 64)})},
			{name: "error type over limit", body: with(okAck, "error", map[string]string{"type": rep("t", 65)}), want: wire.CodeInvalid},
			{name: "error message at limit", body: with(okAck, "error", map[string]string{"type": "x", "message": rep("m", wire.MaxMessageBytes)})},
			{name: "error message over limit", body: with(okAck, "error", map[string]string{"type": "x", "message": rep("m", wire.MaxMessageBytes+1)}), want: wire.CodeInvalid},
			{name: "stdout_tail at limit", body: with(okAck, "stdout_tail", rep("o", wire.MaxTailBytes))},
			{name: "stdout_tail over limit", body: with(okAck, "stdout_tail", rep("o", wire.MaxTailBytes+1)), want: wire.CodeInvalid},
			{name: "stderr_tail at limit", body: with(okAck, "stderr_tail", rep("e", wire.MaxTailBytes))},
			{name: "stderr_tail over limit", body: with(okAck, "stderr_tail", rep("e", wire.MaxTailBytes+1)), want: wire.CodeInvalid},
		}},
		{"bye", func() wire.Validator { return &wire.ByeRequest{} }, []decodeCase{
			{name: "minimal", body: js(okBye)},
			{name: "reason idle", body: with(okBye, "reason", wire.ByeIdle)},
			{name: "reason signal", body: with(okBye, "reason", wire.ByeSignal)},
			{name: "reason drain", body: with(okBye, "reason", wire.ByeDrain)},
			{name: "reason hello_failed", body: with(okBye, "reason", wire.ByeHelloFailed)},
			{name: "reason spot_interruption", body: with(okBye, "reason", wire.ByeSpotInterruption)},
			{name: "reason missing", body: without(okBye, "reason"), want: wire.CodeInvalid},
			{name: "reason unknown", body: with(okBye, "reason", "crash"), want: wire.CodeInvalid},
			{name: "missing worker_id", body: without(okBye, "worker_id"), want: wire.CodeInvalid},
			{name: "worker_id bad", body: with(okBye, "worker_id", "wrk_"), want: wire.CodeInvalid},
			{name: "inflight_abandoned -1", body: with(okBye, "inflight_abandoned", -1), want: wire.CodeInvalid},
			{name: "inflight_abandoned at limit", body: with(okBye, "inflight_abandoned", wire.MaxConcurrency)},
			{name: "inflight_abandoned over limit", body: with(okBye, "inflight_abandoned", wire.MaxConcurrency+1), want: wire.CodeInvalid},
		}},
		{"submit", func() wire.Validator { return &wire.SubmitRequest{} }, []decodeCase{
			{name: "minimal gets default max_attempts", body: js(okSubmit), check: func(t *testing.T, v wire.Validator) {
				if got := v.(*wire.SubmitRequest).MaxAttempts; got != wire.DefaultMaxAttempts {
					t.Errorf("max_attempts = %d, want default %d", got, wire.DefaultMaxAttempts)
				}
			}},
			{name: "max_attempts 0 sent is refused", body: with(okSubmit, "max_attempts", 0), want: wire.CodeInvalid},
			{name: "max_attempts 1", body: with(okSubmit, "max_attempts", 1), check: func(t *testing.T, v wire.Validator) {
				if got := v.(*wire.SubmitRequest).MaxAttempts; got != 1 {
					t.Errorf("max_attempts = %d, want 1", got)
				}
			}},
			{name: "max_attempts at limit", body: with(okSubmit, "max_attempts", wire.MaxAttemptsLimit)},
			{name: "max_attempts over limit", body: with(okSubmit, "max_attempts", wire.MaxAttemptsLimit+1), want: wire.CodeInvalid},
			{name: "max_attempts negative", body: with(okSubmit, "max_attempts", -1), want: wire.CodeInvalid},
			{name: "missing queue", body: without(okSubmit, "queue"), want: wire.CodeInvalid},
			{name: "queue at limit", body: with(okSubmit, "queue", rep("q", wire.MaxQueueLen))},
			{name: "queue over limit", body: with(okSubmit, "queue", rep("q", wire.MaxQueueLen+1)), want: wire.CodeInvalid},
			{name: "queue punctuation allowed", body: with(okSubmit, "queue", "a_b.c-D9")},
			{name: "queue with #", body: with(okSubmit, "queue", "a#b"), want: wire.CodeInvalid},
			{name: "queue unicode", body: with(okSubmit, "queue", "qué"), want: wire.CodeInvalid},
			{name: "missing argv", body: without(okSubmit, "argv"), want: wire.CodeInvalid},
			{name: "empty argv", body: with(okSubmit, "argv", []string{}), want: wire.CodeInvalid},
			{name: "argv program empty", body: with(okSubmit, "argv", []string{"", "x"}), want: wire.CodeInvalid},
			{name: "argv later element empty", body: with(okSubmit, "argv", []string{"echo", ""})},
			{name: "argv items at limit", body: with(okSubmit, "argv", strList(wire.MaxArgvItems, "a"))},
			{name: "argv items over limit", body: with(okSubmit, "argv", strList(wire.MaxArgvItems+1, "a")), want: wire.CodeInvalid},
			{name: "argv bytes at limit", body: with(okSubmit, "argv", []string{"sh", rep("a", wire.MaxArgvBytes-2)})},
			{name: "argv bytes over limit", body: with(okSubmit, "argv", []string{"sh", rep("a", wire.MaxArgvBytes-1)}), want: wire.CodeInvalid},
			{name: "env entries at limit", body: with(okSubmit, "env", strMap(wire.MaxEnvEntries, "K", "v"))},
			{name: "env entries over limit", body: with(okSubmit, "env", strMap(wire.MaxEnvEntries+1, "K", "v")), want: wire.CodeInvalid},
			{name: "env bytes at limit", body: with(okSubmit, "env", map[string]string{"K": rep("v", wire.MaxEnvBytes-1)})},
			{name: "env bytes over limit", body: with(okSubmit, "env", map[string]string{"K": rep("v", wire.MaxEnvBytes)}), want: wire.CodeInvalid},
			{name: "env empty key", body: with(okSubmit, "env", map[string]string{"": "v"}), want: wire.CodeInvalid},
			{name: "env key with =", body: with(okSubmit, "env", map[string]string{"A=B": "v"}), want: wire.CodeInvalid},
			{name: "env key with NUL", body: with(okSubmit, "env", map[string]string{"A\x00": "v"}), want: wire.CodeInvalid},
			{name: "env empty value", body: with(okSubmit, "env", map[string]string{"A": ""})},
			{name: "run_config env entries over limit", body: with(okSubmit, "run_config", map[string]any{"env": strMap(wire.MaxEnvEntries+1, "K", "v")}), want: wire.CodeInvalid},
			{name: "run_config env bytes at limit", body: with(okSubmit, "run_config", map[string]any{"env": map[string]string{"K": rep("v", wire.MaxEnvBytes-1)}})},
			{name: "run_config env bytes over limit", body: with(okSubmit, "run_config", map[string]any{"env": map[string]string{"K": rep("v", wire.MaxEnvBytes)}}), want: wire.CodeInvalid},
			{name: "run_config env key with =", body: with(okSubmit, "run_config", map[string]any{"env": map[string]string{"=": "v"}}), want: wire.CodeInvalid},
			{name: "host_setup at limit", body: with(okSubmit, "run_config", map[string]any{"host_setup": strList(wire.MaxSetupCommands, "true")})},
			{name: "host_setup over limit", body: with(okSubmit, "run_config", map[string]any{"host_setup": strList(wire.MaxSetupCommands+1, "true")}), want: wire.CodeInvalid},
			{name: "host_setup empty command", body: with(okSubmit, "run_config", map[string]any{"host_setup": []string{"true", ""}}), want: wire.CodeInvalid},
			{name: "host_setup bytes at limit", body: with(okSubmit, "run_config", map[string]any{"host_setup": []string{rep("c", wire.MaxSetupBytes)}})},
			{name: "host_setup bytes over limit", body: with(okSubmit, "run_config", map[string]any{"host_setup": []string{rep("c", wire.MaxSetupBytes+1)}}), want: wire.CodeInvalid},
			{name: "run_setup at limit", body: with(okSubmit, "run_config", map[string]any{"run_setup": strList(wire.MaxSetupCommands, "true")})},
			{name: "run_setup over limit", body: with(okSubmit, "run_config", map[string]any{"run_setup": strList(wire.MaxSetupCommands+1, "true")}), want: wire.CodeInvalid},
			{name: "run_setup empty command", body: with(okSubmit, "run_config", map[string]any{"run_setup": []string{""}}), want: wire.CodeInvalid},
			{name: "run_setup bytes over limit", body: with(okSubmit, "run_config", map[string]any{"run_setup": []string{rep("c", wire.MaxSetupBytes), "d"}}), want: wire.CodeInvalid},
			{name: "workdir at limit", body: with(okSubmit, "run_config", map[string]any{"workdir": rep("w", 1024)})},
			{name: "workdir over limit", body: with(okSubmit, "run_config", map[string]any{"workdir": rep("w", 1025)}), want: wire.CodeInvalid},
			{name: "run_config wrong type", body: with(okSubmit, "run_config", []string{"x"}), want: wire.CodeInvalid},
			{name: "timeout_s 0", body: with(okSubmit, "timeout_s", 0)},
			{name: "timeout_s at limit", body: with(okSubmit, "timeout_s", wire.MaxTimeoutS)},
			{name: "timeout_s over limit", body: with(okSubmit, "timeout_s", wire.MaxTimeoutS+1), want: wire.CodeInvalid},
			{name: "timeout_s negative", body: with(okSubmit, "timeout_s", -1), want: wire.CodeInvalid},
			{name: "timeout_s huge", body: with(okSubmit, "timeout_s", json.Number("99999999999999999999")), want: wire.CodeInvalid},
			{name: "idempotency_key at limit", body: with(okSubmit, "idempotency_key", rep("k", wire.MaxIDLen))},
			{name: "idempotency_key over limit", body: with(okSubmit, "idempotency_key", rep("k", wire.MaxIDLen+1)), want: wire.CodeInvalid},
		}},
		{"setup", func() wire.Validator { return &wire.SetupRequest{} }, []decodeCase{
			{name: "minimal", body: js(okSetup)},
			{name: "missing argv", body: `{}`, want: wire.CodeInvalid},
			{name: "empty argv", body: `{"argv":[]}`, want: wire.CodeInvalid},
			{name: "program empty", body: `{"argv":[""]}`, want: wire.CodeInvalid},
			{name: "argv items over limit", body: js(wire.SetupRequest{Argv: strList(wire.MaxArgvItems+1, "a")}), want: wire.CodeInvalid},
			{name: "argv bytes at limit", body: js(wire.SetupRequest{Argv: []string{rep("a", wire.MaxArgvBytes)}})},
			{name: "argv bytes over limit", body: js(wire.SetupRequest{Argv: []string{rep("a", wire.MaxArgvBytes+1)}}), want: wire.CodeInvalid},
		}},
	}
	for _, s := range suites {
		t.Run(s.name, func(t *testing.T) {
			for _, tc := range s.cases {
				t.Run(tc.name, func(t *testing.T) {
					v := s.new()
					err := wire.Decode(strings.NewReader(tc.body), v)
					if tc.want == "" {
						if err != nil {
							t.Fatalf("Decode refused a good body: %v", err)
						}
						if tc.check != nil {
							tc.check(t, v)
						}
						return
					}
					if err == nil {
						t.Fatalf("Decode accepted a bad body, want %s", tc.want)
					}
					if got := wire.CodeOf(err); got != tc.want {
						t.Errorf("code = %s, want %s (%v)", got, tc.want, err)
					}
					var we *wire.Error
					if !errors.As(err, &we) || we.Message == "" {
						t.Errorf("refusal %v carries no message for the client", err)
					}
				})
			}
		})
	}
}

// TestDecodeMessagesClipLongValues checks that a refusal never echoes a huge
// value back in full.
func TestDecodeMessagesClipLongValues(t *testing.T) {
	long := rep("Z", 10000)
	err := wire.Decode(strings.NewReader(with(okPoll, "worker_id", "wrk_"+long)), &wire.PollRequest{})
	if err == nil {
		t.Fatal("accepted")
	}
	if msg := wire.BodyFor(err).Error.Message; len(msg) > 512 {
		t.Errorf("message is %d bytes; it should clip the value", len(msg))
	}
}

// TestDecodeMessagesNameTheField: a type error says which field is wrong.
func TestDecodeMessagesNameTheField(t *testing.T) {
	cases := []struct {
		name, body, want string
		v                wire.Validator
	}{
		{"wrong type", with(okSubmit, "queue", 5), "queue", &wire.SubmitRequest{}},
		{"missing id", without(okAck, "invocation_id"), "invocation_id", &wire.AckRequest{}},
		{"bad enum", with(okBye, "reason", "crash"), "reason", &wire.ByeRequest{}},
		{"over a limit", with(okAck, "stdout_tail", rep("o", wire.MaxTailBytes+1)), "stdout_tail", &wire.AckRequest{}},
		{"syntax", `{"queue":}`, "syntax error", &wire.SubmitRequest{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := wire.Decode(strings.NewReader(tc.body), tc.v)
			if msg := wire.BodyFor(err).Error.Message; !strings.Contains(msg, tc.want) {
				t.Errorf("message %q does not mention %q", msg, tc.want)
			}
		})
	}
}

type failingReader struct{}

func (failingReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

func TestDecodeReadError(t *testing.T) {
	err := wire.Decode(io.MultiReader(strings.NewReader(`{"queue":`), failingReader{}), &wire.SubmitRequest{})
	if got := wire.CodeOf(err); got != wire.CodeInvalid {
		t.Errorf("code = %s, want invalid (%v)", got, err)
	}
}

// TestDecodeDoesNotReadPastLimit checks that a huge body is not read whole.
func TestDecodeDoesNotReadPastLimit(t *testing.T) {
	r := &countingReader{r: bytes.NewReader(make([]byte, 10*wire.MaxBodyBytes))}
	err := wire.Decode(r, &wire.SubmitRequest{})
	if wire.CodeOf(err) != wire.CodeTooLarge {
		t.Fatalf("err = %v, want too_large", err)
	}
	if r.n > wire.MaxBodyBytes+1 {
		t.Errorf("read %d bytes; want at most %d", r.n, wire.MaxBodyBytes+1)
	}
}

type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func TestValidQueue(t *testing.T) {
	cases := []struct {
		q    string
		want bool
	}{
		{"default", true}, {"a", true}, {rep("a", 64), true}, {"A-z_0.9", true},
		{"", false}, {rep("a", 65), false}, {"a b", false}, {"a#b", false}, {"a/b", false}, {"ü", false},
		{".", false}, {"..", false}, {"-x", false},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%.20q", tc.q), func(t *testing.T) {
			if got := wire.ValidQueue(tc.q); got != tc.want {
				t.Errorf("ValidQueue(%q) = %v, want %v", tc.q, got, tc.want)
			}
		})
	}
}

func TestTerminal(t *testing.T) {
	want := map[string]bool{
		wire.StateQueued: false, wire.StateRunning: false,
		wire.StateSucceeded: true, wire.StateFailed: true, wire.StateCancelled: true, "": false, "bogus": false,
	}
	for s, w := range want {
		if got := wire.Terminal(s); got != w {
			t.Errorf("Terminal(%q) = %v, want %v", s, got, w)
		}
	}
	if len(wire.InvocationStates) != 5 {
		t.Errorf("InvocationStates = %v", wire.InvocationStates)
	}
}

// --- errors ---

func TestStatus(t *testing.T) {
	cases := []struct {
		code wire.Code
		want int
	}{
		{wire.CodeInvalid, 400},
		{wire.CodeUnauthorized, 401},
		{wire.CodeForbidden, 403},
		{wire.CodeNotFound, 404},
		{wire.CodeNoRoute, 404},
		{wire.CodeNotAllowed, 405},
		{wire.CodeConflict, 409},
		{wire.CodeWorkerGone, 410},
		{wire.CodeTooLarge, 413},
		{wire.CodeInternal, 500},
		{wire.CodeUnavailable, 503},
		{"", 500},
		{"teapot", 500},
	}
	for _, tc := range cases {
		t.Run(string(tc.code), func(t *testing.T) {
			if got := wire.Status(tc.code); got != tc.want {
				t.Errorf("Status(%q) = %d, want %d", tc.code, got, tc.want)
			}
		})
	}
}

func TestCodeOf(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want wire.Code
	}{
		{"wire error", wire.Errorf(wire.CodeConflict, "x"), wire.CodeConflict},
		{"wrapped wire error", fmt.Errorf("op: %w", wire.Errorf(wire.CodeNotFound, "x")), wire.CodeNotFound},
		{"joined", errors.Join(errors.New("a"), wire.Errorf(wire.CodeWorkerGone, "x")), wire.CodeWorkerGone},
		{"plain error", errors.New("boom"), wire.CodeInternal},
		{"nil", nil, wire.CodeInternal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := wire.CodeOf(tc.err); got != tc.want {
				t.Errorf("CodeOf = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestBodyFor(t *testing.T) {
	secret := "dynamodb: table t-invocations ARN arn:aws:… access denied"
	cases := []struct {
		name     string
		err      error
		wantCode wire.Code
		wantMsg  string
	}{
		{"invalid keeps its message", wire.Errorf(wire.CodeInvalid, "queue is required"), wire.CodeInvalid, "queue is required"},
		{"wrapped keeps code and message", fmt.Errorf("submit: %w", wire.Errorf(wire.CodeConflict, "key reused")), wire.CodeConflict, "key reused"},
		{"cause is never sent", &wire.Error{Code: wire.CodeUnavailable, Message: "try again", Err: errors.New(secret)}, wire.CodeUnavailable, "try again"},
		{"internal message hidden", wire.Errorf(wire.CodeInternal, "%s", secret), wire.CodeInternal, ""},
		{"plain error hidden", errors.New(secret), wire.CodeInternal, ""},
		{"wrapped plain error hidden", fmt.Errorf("x: %w", errors.New(secret)), wire.CodeInternal, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := wire.BodyFor(tc.err)
			if body.Error.Code != tc.wantCode {
				t.Errorf("code = %s, want %s", body.Error.Code, tc.wantCode)
			}
			if tc.wantMsg != "" && body.Error.Message != tc.wantMsg {
				t.Errorf("message = %q, want %q", body.Error.Message, tc.wantMsg)
			}
			if body.Error.Message == "" {
				t.Error("message is empty")
			}
			b, _ := json.Marshal(body)
			if strings.Contains(string(b), "dynamodb") || strings.Contains(string(b), "arn:") {
				t.Errorf("body leaks internals: %s", b)
			}
		})
	}
}

func TestErrorsIs(t *testing.T) {
	sentinels := map[wire.Code]error{
		wire.CodeInvalid:      wire.ErrInvalid,
		wire.CodeUnauthorized: wire.ErrUnauthorized,
		wire.CodeForbidden:    wire.ErrForbidden,
		wire.CodeNotFound:     wire.ErrNotFound,
		wire.CodeConflict:     wire.ErrConflict,
		wire.CodeWorkerGone:   wire.ErrWorkerGone,
	}
	for code, sentinel := range sentinels {
		t.Run(string(code), func(t *testing.T) {
			err := wire.Errorf(code, "something about %s", "x")
			if !errors.Is(err, sentinel) {
				t.Errorf("errors.Is(%v, sentinel) = false", err)
			}
			if !errors.Is(fmt.Errorf("layer: %w", err), sentinel) {
				t.Error("wrapped error does not match its sentinel")
			}
			for other, s := range sentinels {
				if other != code && errors.Is(err, s) {
					t.Errorf("%s error matches the %s sentinel", code, other)
				}
			}
			if errors.Is(err, wire.Errorf(code, "a different message")) {
				t.Error("an error with a message as target should match only itself")
			}
			if errors.Is(errors.New("plain"), sentinel) {
				t.Error("a plain error matches a sentinel")
			}
		})
	}
}

func TestErrorUnwrapAndString(t *testing.T) {
	cause := errors.New("conditional check failed")
	err := &wire.Error{Code: wire.CodeConflict, Message: "lost a race", Err: cause}
	if !errors.Is(err, cause) {
		t.Error("errors.Is does not reach the cause")
	}
	if got, want := err.Error(), "conflict: lost a race: conditional check failed"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	if got, want := wire.Errorf(wire.CodeInvalid, "n=%d", 3).Error(), "invalid: n=3"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}

// TestLogsRequestBytesPerRequest: one logs request carries at most
// MaxLogBytesPerRequest of output, counted over all its attempts' chunks:
// exactly that much is valid, one byte more is refused.
func TestLogsRequestBytesPerRequest(t *testing.T) {
	const chunk = wire.MaxLogBytesPerRequest / 4
	full := func(seq int) wire.LogChunk {
		return wire.LogChunk{Seq: seq, Stream: "stdout", Data: bytes.Repeat([]byte("x"), chunk), At: t0}
	}
	// Two attempts, two full chunks each: the limit exactly.
	req := wire.LogsRequest{WorkerID: workerID, Logs: []wire.LogBatch{
		{InvocationID: invID, Attempt: 1, Chunks: []wire.LogChunk{full(0), full(1)}},
		{InvocationID: invID, Attempt: 2, Chunks: []wire.LogChunk{full(0), full(1)}},
	}}
	if err := req.Validate(); err != nil {
		t.Fatalf("exactly %d bytes over two attempts: %v; want valid", wire.MaxLogBytesPerRequest, err)
	}
	req.Logs[1].Chunks = append(req.Logs[1].Chunks, wire.LogChunk{Seq: 2, Stream: "stderr", Data: []byte("y"), At: t0})
	if err := req.Validate(); wire.CodeOf(err) != wire.CodeInvalid {
		t.Fatalf("one byte past %d: %v; want invalid", wire.MaxLogBytesPerRequest, err)
	}
}
