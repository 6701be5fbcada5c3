package wire_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// TestSubmitInputChecked pins what a submit's input may be: any JSON value
// of at most MaxInputBytes compact; anything else is a 400 naming input.
func TestSubmitInputChecked(t *testing.T) {
	big := `"` + strings.Repeat("x", wire.MaxInputBytes-1) + `"` // MaxInputBytes+1 bytes
	cases := []struct {
		name, input, refused string
	}{
		{name: "not JSON", input: `{"a":`, refused: "input is not valid JSON"},
		{name: "over the limit", input: big, refused: "the limit is 262144"},
		{name: "at the limit", input: big[:len(big)-2] + `"`},
		{name: "whitespace does not count", input: big[:len(big)-2] + `"` + "   \n"},
		{name: "an object", input: `{"a":[1,2,{"b":null}]}`},
		{name: "a number", input: `3`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := wire.SubmitRequest{Queue: "default", Argv: []string{"true"}, Input: json.RawMessage(tc.input)}
			err := req.Validate()
			if tc.refused == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), tc.refused) {
				t.Fatalf("Validate = %v, want invalid holding %q", err, tc.refused)
			}
			if got := wire.Status(wire.CodeOf(err)); got != 400 {
				t.Fatalf("status %d, want 400", got)
			}
		})
	}
}

// TestInputRoundTrip follows an input from a submit's body to the run
// command a poll hands nymph: compacted, and the same value throughout.
func TestInputRoundTrip(t *testing.T) {
	var req wire.SubmitRequest
	body := `{"queue":"default","argv":["true"],"input":{ "a" : [1, 2], "s": "é\u00e9" }}`
	if err := wire.Decode(strings.NewReader(body), &req); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	spec := req.Spec()
	const want = `{"a":[1,2],"s":"é\u00e9"}`
	if spec.Input != want {
		t.Fatalf("Spec().Input = %s, want %s", spec.Input, want)
	}
	inv := domain.NewInvocation("inv-1", spec, time.Unix(0, 0))
	if inv.Input != want {
		t.Fatalf("NewInvocation().Input = %s, want %s", inv.Input, want)
	}
	b, err := json.Marshal(wire.CommandOf(domain.Command{Type: "run", Run: &inv}))
	if err != nil {
		t.Fatalf("marshal: %v", err)
	}
	var cmd wire.Command
	if err := json.Unmarshal(b, &cmd); err != nil {
		t.Fatalf("unmarshal %s: %v", b, err)
	}
	if cmd.Invocation == nil || string(cmd.Invocation.Input) != want {
		t.Fatalf("run command %s carries no input %s", b, want)
	}

	// No input, or JSON null: the run command carries none.
	for _, body := range []string{`{"queue":"default","argv":["true"]}`, `{"queue":"default","argv":["true"],"input":null}`} {
		var req wire.SubmitRequest
		if err := wire.Decode(strings.NewReader(body), &req); err != nil {
			t.Fatalf("Decode(%s): %v", body, err)
		}
		inv := domain.NewInvocation("inv-2", req.Spec(), time.Unix(0, 0))
		b, _ := json.Marshal(wire.CommandOf(domain.Command{Type: "run", Run: &inv}))
		if strings.Contains(string(b), `"input"`) {
			t.Fatalf("%s: run command %s carries an input", body, b)
		}
	}
}

// TestInputKeepsRequestHash pins the idempotency hash of requests without
// input to what it was before input existed (the hashes below were
// computed by the code without it): keys recorded then keep matching.
func TestInputKeepsRequestHash(t *testing.T) {
	sub := `{"queue":"default","argv":["sh","-c","x"],"env":{"A":"1"},"idempotency_key":"k1","retry":{"exit_codes":[3]}}`
	var req wire.SubmitRequest
	if err := wire.Decode(strings.NewReader(sub), &req); err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if got, want := req.Spec().RequestHash, submitHash; got != want {
		t.Fatalf("submit hash = %s, want %s", got, want)
	}
	run := `{"queue":"default","argv":["echo","{n}"],"idempotency_key":"k2","matrix":{"n":["1","2"]}}`
	var rreq wire.RunRequest
	if err := wire.DecodeLimit(strings.NewReader(run), &rreq, wire.MaxRunBodyBytes); err != nil {
		t.Fatalf("Decode run: %v", err)
	}
	if got, want := rreq.RunSpec().RequestHash, runHash; got != want {
		t.Fatalf("run hash = %s, want %s", got, want)
	}
}

const (
	submitHash = "7642e066aac468fea7c57dbd47aac3564d235778451fe8a8190a3de47dc1e98f"
	runHash    = "55446cfc50010a39d5413159a444c05ed94a86573e5b66e048c445331a5c3f37"
)

// TestRunInput pins a run's input: the run's is every job's default, a
// listed job's own replaces it, each is checked as a submit's would be.
func TestRunInput(t *testing.T) {
	decode := func(body string) (wire.RunRequest, error) {
		var r wire.RunRequest
		return r, wire.DecodeLimit(strings.NewReader(body), &r, wire.MaxRunBodyBytes)
	}
	r, err := decode(`{"queue":"q","argv":["true"],"input":{"d": 1},"jobs":[{},{"input":[ 2 ]},{"input":null}]}`)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	jobs := r.RunSpec().Jobs
	for i, want := range []string{`{"d":1}`, `[2]`, `{"d":1}`} {
		if jobs[i].Spec.Input != want {
			t.Errorf("job %d input = %q, want %q", i, jobs[i].Spec.Input, want)
		}
	}
	r, err = decode(`{"queue":"q","argv":["echo","{n}"],"input":"all","matrix":{"n":["1","2"]}}`)
	if err != nil {
		t.Fatalf("decode matrix: %v", err)
	}
	for i, j := range r.RunSpec().Jobs {
		if j.Spec.Input != `"all"` {
			t.Errorf("matrix job %d input = %q, want \"all\"", i, j.Spec.Input)
		}
	}
	big := `"` + strings.Repeat("x", wire.MaxInputBytes) + `"`
	for body, refused := range map[string]string{
		`{"queue":"q","argv":["true"],"input":` + big + `,"jobs":[{}]}`:   "input is 262146 bytes",
		`{"queue":"q","argv":["true"],"jobs":[{},{"input":` + big + `}]}`: "jobs[1]: input is 262146 bytes",
	} {
		_, err := decode(body)
		if !errors.Is(err, wire.ErrInvalid) || !strings.Contains(err.Error(), refused) || wire.Status(wire.CodeOf(err)) != 400 {
			t.Errorf("decode(%.60s...) = %v, want a 400 holding %q", body, err, refused)
		}
	}
}

// TestSubmitRowBudget: input, argv, env and run_config together past
// MaxSpecBytes are refused (the invocation's row, with a full result,
// would pass DynamoDB's 400 KB item limit); an input at its own limit
// with the rest at the budget is accepted.
func TestSubmitRowBudget(t *testing.T) {
	input := json.RawMessage(`"` + strings.Repeat("x", wire.MaxInputBytes-2) + `"`)
	rest := wire.MaxSpecBytes - wire.MaxInputBytes
	ok := wire.SubmitRequest{Queue: "q", Argv: []string{strings.Repeat("a", rest)}, Input: input}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a submit at the budget: %v", err)
	}
	over := wire.SubmitRequest{Queue: "q", Argv: []string{strings.Repeat("a", rest), "y"}, Input: input}
	if err := over.Validate(); wire.CodeOf(err) != wire.CodeInvalid || !strings.Contains(err.Error(), "400 KB") {
		t.Fatalf("a submit one byte past the budget: %v, want invalid naming the item limit", err)
	}
}
