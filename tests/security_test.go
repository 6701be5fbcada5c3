package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/client"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// securityPlane is `lakeshore dev` over an embedded store this test process
// serves, so the test can read every table before and after each refusal.
type securityPlane struct {
	d      *devServer
	db     *dynamodb.Client
	prefix string
}

func startSecurityPlane(t *testing.T, lambdas bool) securityPlane {
	t.Helper()
	endpoint := storetest.EmbeddedEndpoint(t)
	prefix := storetest.Prefix(t)
	b := backend{"embedded endpoint", func(t testing.TB) ([]string, []string) {
		args := []string{"--store", "aws", "--table-prefix", prefix, "--host-poll-interval", "0"}
		if lambdas {
			rieBin(t)
			args = append(args, "--lambdas", lambdaDist(t))
		}
		return args, []string{"AWS_ENDPOINT_URL=" + endpoint, "AWS_REGION=" + storetest.Region,
			"AWS_ACCESS_KEY_ID=local", "AWS_SECRET_ACCESS_KEY=local", "AWS_EC2_METADATA_DISABLED=true"}
	}}
	return securityPlane{d: startDev(t, b, "--stale-after", "60s"), db: storetest.Client(endpoint), prefix: prefix}
}

// raw sends one request with an exact Authorization header and body.
func (p securityPlane) raw(t *testing.T, method, path, auth, body string) (int, wire.ErrorBody, string) {
	t.Helper()
	req, err := http.NewRequest(method, p.d.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var eb wire.ErrorBody
	_ = json.Unmarshal(b, &eb)
	return resp.StatusCode, eb, string(b)
}

type securityCase struct {
	name, method, path, auth, body string
	status                         int
	code                           wire.Code
	// records, when set, is the one store row the refusal may change
	// (it is evidence the control plane keeps), by a string its diff holds.
	records string
}

func js(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// withJSON renders v as JSON with field set to val (nil: removed).
func withJSON(v any, field string, val any) string {
	var m map[string]any
	_ = json.Unmarshal([]byte(js(v)), &m)
	if val == nil {
		delete(m, field)
	} else {
		m[field] = val
	}
	return js(m)
}

// TestSecurityAgainstDev drives the real `lakeshore dev` (in process, and
// through the Lambda bootstraps) with every token misuse, every class of bad
// input and every size cap of docs/design.md §9 and docs/limits.md, and asserts the
// status, the error code, that no message echoes a token, and that not one
// item in any table changed.
func TestSecurityAgainstDev(t *testing.T) {
	for _, lambdas := range []bool{false, true} {
		name := map[bool]string{false: "in process", true: "lambdas"}[lambdas]
		t.Run(name, func(t *testing.T) { securitySuite(t, startSecurityPlane(t, lambdas)) })
	}
}

func securitySuite(t *testing.T, p securityPlane) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	op := p.d.Operator()
	helloAs := func(machine, boot string) (string, string) {
		res, err := p.d.Enroll().Hello(ctx, wire.HelloRequest{MachineID: machine, BootID: boot, Lanes: []string{"q"}})
		if err != nil {
			t.Fatalf("hello %s: %v", machine, err)
		}
		return res.WorkerID, res.Token
	}
	aID, aTok := helloAs("m-a", "boot-1")
	bID, bTok := helloAs("m-b", "boot-1")
	_, oldTok := helloAs("m-old", "boot-1")
	oldID := "wrk_" + strings.Split(strings.TrimPrefix(oldTok, "wtk_"), "_")[0]
	helloAs("m-old", "boot-2") // a new boot: the old token's worker is gone

	running, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	poll, err := client.New(p.d.URL, aTok).Poll(ctx, wire.PollRequest{WorkerID: aID, Queue: "q", Phase: wire.PhaseReady, Invocations: []string{}})
	if err != nil || len(poll.Commands) != 1 {
		t.Fatalf("A claims: %+v %v", poll, err)
	}
	queued, _, err := op.Submit(ctx, wire.SubmitRequest{Queue: "q", Argv: []string{"true"}, Env: map[string]string{"SECRET": "s3cr3t"}})
	if err != nil {
		t.Fatal(err)
	}

	bearer := func(tok string) string { return "Bearer " + tok }
	forgedA := "wtk_" + strings.TrimPrefix(aID, "wrk_") + "_" + strings.Repeat("A", 43)
	goodPoll := wire.PollRequest{WorkerID: aID, Queue: "q", Phase: wire.PhaseReady, Invocations: []string{running.InvocationID}}
	goodAck := wire.AckRequest{WorkerID: aID, InvocationID: running.InvocationID, Attempt: 1, State: wire.StateSucceeded}
	goodBye := wire.ByeRequest{WorkerID: aID, Reason: wire.ByeIdle}
	goodSubmit := wire.SubmitRequest{Queue: "q", Argv: []string{"echo", "hi"}}
	daemon := map[string]string{"poll": js(goodPoll), "ack": js(goodAck), "bye": js(goodBye)}

	var cases []securityCase
	add := func(name, method, path, auth, body string, status int, code wire.Code) {
		cases = append(cases, securityCase{name: name, method: method, path: path, auth: auth, body: body, status: status, code: code})
	}
	const unauth, forbidden, invalid = wire.CodeUnauthorized, wire.CodeForbidden, wire.CodeInvalid

	// Token misuse: each token is good for its own routes only.
	hello := js(wire.HelloRequest{MachineID: "m-new", BootID: "b"})
	add("hello without a token", "POST", "/v1/daemon/hello", "", hello, 401, unauth)
	add("hello with the operator token", "POST", "/v1/daemon/hello", bearer(p.d.OperatorToken), hello, 401, unauth)
	add("hello with a worker token", "POST", "/v1/daemon/hello", bearer(aTok), hello, 401, unauth)
	add("hello with a Basic scheme", "POST", "/v1/daemon/hello", "Basic "+p.d.EnrollToken, hello, 401, unauth)
	add("hello with the enrollment token truncated", "POST", "/v1/daemon/hello", bearer(p.d.EnrollToken[1:]), hello, 401, unauth)
	for _, r := range []string{"poll", "ack", "bye"} {
		path := "/v1/daemon/" + r
		add(r+" with the enrollment token", "POST", path, bearer(p.d.EnrollToken), daemon[r], 401, unauth)
		add(r+" with the operator token", "POST", path, bearer(p.d.OperatorToken), daemon[r], 401, unauth)
		add(r+" with B's token acting for A", "POST", path, bearer(bTok), daemon[r], 403, forbidden)
		add(r+" with a forged token (A's id, wrong secret)", "POST", path, bearer(forgedA), daemon[r], 401, unauth)
		add(r+" without a token", "POST", path, "", daemon[r], 401, unauth)
	}
	add("B acks the invocation A runs", "POST", "/v1/daemon/ack", bearer(bTok),
		js(wire.AckRequest{WorkerID: bID, InvocationID: running.InvocationID, Attempt: 1, State: wire.StateFailed}), 403, forbidden)
	add("A acks an attempt it never ran", "POST", "/v1/daemon/ack", bearer(aTok),
		js(wire.AckRequest{WorkerID: aID, InvocationID: running.InvocationID, Attempt: 2, State: wire.StateFailed}), 403, forbidden)
	add("a superseded boot's token polls", "POST", "/v1/daemon/poll", bearer(oldTok),
		js(wire.PollRequest{WorkerID: oldID, Queue: "q", Phase: wire.PhaseReady}), 410, wire.CodeWorkerGone)
	// That poll proves the replaced boot still runs: the control plane
	// records the machine id conflict on its worker row, and only there.
	cases[len(cases)-1].records = `"machine_conflict":true`
	for _, r := range []struct{ method, path, body string }{
		{"GET", "/v1/workers", ""},
		{"GET", "/v1/invocations/" + queued.InvocationID, ""},
		{"POST", "/v1/invocations", js(goodSubmit)},
		{"POST", "/v1/invocations/" + queued.InvocationID + "/cancel", ""},
		{"POST", "/v1/workers/" + aID + "/drain", ""},
		{"POST", "/v1/workers/" + aID + "/setup", js(wire.SetupRequest{Argv: []string{"true"}})},
	} {
		route := r.method + " " + r.path
		add(route+" with a worker token", r.method, r.path, bearer(aTok), r.body, 401, unauth)
		add(route+" with the enrollment token", r.method, r.path, bearer(p.d.EnrollToken), r.body, 401, unauth)
		add(route+" without a token", r.method, r.path, "", r.body, 401, unauth)
	}

	// Bad input, refused before any store call.
	submit, opTok := "/v1/invocations", bearer(p.d.OperatorToken)
	big := `{"queue":"q","argv":["x"],"pad":"` + strings.Repeat("x", wire.MaxBodyBytes) + `"}`
	add("body over 256 KiB", "POST", submit, opTok, big, 413, wire.CodeTooLarge)
	add("not JSON", "POST", submit, opTok, "queue=q", 400, invalid)
	add("empty body", "POST", submit, opTok, "", 400, invalid)
	add("trailing data", "POST", submit, opTok, js(goodSubmit)+`{"x":1}`, 400, invalid)
	add("duplicate key", "POST", submit, opTok, `{"queue":"q","argv":["a"],"queue":"r"}`, 400, invalid)
	add("duplicate key in another case", "POST", "/v1/daemon/poll", bearer(aTok),
		`{"worker_id":"`+aID+`","WORKER_ID":"`+bID+`","queue":"q"}`, 400, invalid)
	add("invalid UTF-8", "POST", submit, opTok, "{\"queue\":\"q\xff\",\"argv\":[\"a\"]}", 400, invalid)
	add("missing worker_id", "POST", "/v1/daemon/poll", bearer(aTok), withJSON(goodPoll, "worker_id", nil), 400, invalid)
	add("malformed worker_id", "POST", "/v1/daemon/poll", bearer(aTok), withJSON(goodPoll, "worker_id", "wrk_123"), 400, invalid)
	add("malformed invocation_id", "POST", "/v1/daemon/ack", bearer(aTok), withJSON(goodAck, "invocation_id", "inv_../x"), 400, invalid)
	add("malformed id in a path", "GET", "/v1/invocations/inv_nope", opTok, "", 400, invalid)
	add("malformed worker id in a path", "POST", "/v1/workers/wrk_nope/drain", opTok, "", 400, invalid)
	add("unknown phase", "POST", "/v1/daemon/poll", bearer(aTok), withJSON(goodPoll, "phase", "flying"), 400, invalid)
	add("unknown ack state", "POST", "/v1/daemon/ack", bearer(aTok), withJSON(goodAck, "state", "exploded"), 400, invalid)
	add("unknown bye reason", "POST", "/v1/daemon/bye", bearer(aTok), withJSON(goodBye, "reason", "bored"), 400, invalid)
	add("unknown state filter", "GET", "/v1/invocations?state=weird", opTok, "", 400, invalid)
	add("attempt 0", "POST", "/v1/daemon/ack", bearer(aTok), withJSON(goodAck, "attempt", 0), 400, invalid)
	add("negative timeout_s", "POST", submit, opTok, withJSON(goodSubmit, "timeout_s", -1), 400, invalid)
	add("timeout_s over a week", "POST", submit, opTok, withJSON(goodSubmit, "timeout_s", wire.MaxTimeoutS+1), 400, invalid)
	add("max_attempts over the limit", "POST", submit, opTok, withJSON(goodSubmit, "max_attempts", wire.MaxAttemptsLimit+1), 400, invalid)
	add("poll timeout_s out of range", "POST", "/v1/daemon/poll", bearer(aTok), withJSON(goodPoll, "timeout_s", 1e9), 400, invalid)
	add("number where a string belongs", "POST", submit, opTok, withJSON(goodSubmit, "queue", 7), 400, invalid)

	// Size caps (docs/limits.md).
	add("argv over 64 KiB", "POST", submit, opTok, withJSON(goodSubmit, "argv", []string{strings.Repeat("a", wire.MaxArgvBytes+1)}), 400, invalid)
	env := map[string]string{}
	for i := range wire.MaxEnvEntries + 1 {
		env[fmt.Sprintf("K%03d", i)] = "v"
	}
	add("env over 100 entries", "POST", submit, opTok, withJSON(goodSubmit, "env", env), 400, invalid)
	add("env over 32 KiB", "POST", submit, opTok, withJSON(goodSubmit, "env", map[string]string{"K": strings.Repeat("v", wire.MaxEnvBytes)}), 400, invalid)
	add("queue name over 64", "POST", submit, opTok, withJSON(goodSubmit, "queue", strings.Repeat("q", wire.MaxQueueLen+1)), 400, invalid)
	add("queue name with a slash", "POST", submit, opTok, withJSON(goodSubmit, "queue", "a/b"), 400, invalid)
	add("result_blob over 128 KiB", "POST", "/v1/daemon/ack", bearer(aTok),
		withJSON(goodAck, "result_blob", map[string]string{"x": strings.Repeat("r", wire.MaxResultBlobBytes)}), 400, invalid)
	add("stdout_tail over 4 KiB", "POST", "/v1/daemon/ack", bearer(aTok), withJSON(goodAck, "stdout_tail", strings.Repeat("o", wire.MaxTailBytes+1)), 400, invalid)
	add("setup argv over 64 KiB", "POST", "/v1/workers/"+aID+"/setup", opTok,
		js(wire.SetupRequest{Argv: []string{strings.Repeat("a", wire.MaxArgvBytes+1)}}), 400, invalid)

	secrets := []string{aTok, bTok, oldTok, p.d.OperatorToken, p.d.EnrollToken, "s3cr3t"}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := storetest.TakeSnapshot(t, p.db, p.prefix)
			status, eb, body := p.raw(t, tc.method, tc.path, tc.auth, tc.body)
			if status != tc.status || eb.Error.Code != tc.code {
				t.Errorf("got %d %s, want %d %s; body %.300s", status, eb.Error.Code, tc.status, tc.code, body)
			}
			if eb.Error.Message == "" {
				t.Errorf("error without a message: %.300s", body)
			}
			for _, s := range secrets {
				if strings.Contains(body, s) {
					t.Errorf("the answer echoes a secret: %.300s", body)
				}
			}
			d := before.Diff(storetest.TakeSnapshot(t, p.db, p.prefix))
			switch {
			case tc.records != "" && (strings.Count(d, "\n") != 2 || !strings.Contains(d, tc.records)):
				t.Errorf("the refusal was to change one row, recording %s; the store changed:\n%s", tc.records, d)
			case tc.records == "" && d != "":
				t.Errorf("a refused request changed the store:\n%s", d)
			}
		})
	}

	// Control: the fixture's tokens do work, so each refusal above was for
	// the reason it names; and operator reads never show env values.
	if status, _, body := p.raw(t, "POST", "/v1/daemon/ack", bearer(aTok), js(goodAck)); status != 200 {
		t.Errorf("control ack: %d %s", status, body)
	}
	if status, _, body := p.raw(t, "GET", "/v1/invocations/"+queued.InvocationID, opTok, ""); status != 200 ||
		strings.Contains(body, "s3cr3t") || !strings.Contains(body, wire.Redacted) {
		t.Errorf("operator view of an invocation with env: %d %s", status, body)
	}
}
