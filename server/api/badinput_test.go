package api_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// oversized returns a JSON object body of exactly n bytes.
func oversized(n int) string {
	const head, tail = `{"pad":"`, `"}`
	return head + strings.Repeat("x", n-len(head)-len(tail)) + tail
}

// withField renders base as JSON with field set to v.
func withField(base any, field string, v any) string {
	b, err := json.Marshal(base)
	if err != nil {
		panic(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		panic(err)
	}
	if v == nil {
		delete(m, field)
	} else {
		m[field] = v
	}
	b, err = json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}

type badCase struct {
	name         string
	method, path string
	token        string
	body         any
	status       int
	code         wire.Code
	allow        string // for 405: the Allow header wanted
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func manyEnv(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[fmt.Sprintf("K%04d", i)] = "v"
	}
	return m
}

// bodyCases are the refusals every route with a JSON body shares.
func bodyCases(good any) []badCase {
	goodJSON, _ := json.Marshal(good)
	return []badCase{
		{name: "body over 256 KiB", body: oversized(wire.MaxBodyBytes + 1), status: 413, code: wire.CodeTooLarge},
		{name: "empty body", body: "", status: 400, code: wire.CodeInvalid},
		{name: "not JSON", body: "worker_id=x", status: 400, code: wire.CodeInvalid},
		{name: "JSON array", body: "[1,2]", status: 400, code: wire.CodeInvalid},
		{name: "trailing data", body: string(goodJSON) + `{"again":1}`, status: 400, code: wire.CodeInvalid},
		{name: "trailing garbage", body: string(goodJSON) + "garbage", status: 400, code: wire.CodeInvalid},
		{name: "truncated", body: string(goodJSON[:len(goodJSON)-1]), status: 400, code: wire.CodeInvalid},
		{name: "invalid UTF-8", body: strings.Replace(string(goodJSON), `"`, "\"\xff", 3), status: 400, code: wire.CodeInvalid},
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	f := newAuthFixture(t)
	h := f.h
	a := f.a

	hello := wire.HelloRequest{MachineID: "machine-new", BootID: "boot-1", Lanes: []string{"default"}}
	poll := wire.PollRequest{WorkerID: a.id, Phase: wire.PhaseReady, Invocations: []string{f.running}}
	ack := wire.AckRequest{WorkerID: a.id, InvocationID: f.running, Attempt: 1, State: wire.StateSucceeded}
	bye := wire.ByeRequest{WorkerID: a.id, Reason: wire.ByeIdle}
	submit := wire.SubmitRequest{Queue: "default", Argv: []string{"x"}}
	setup := wire.SetupRequest{Argv: []string{"true"}}

	type group struct {
		method, path, token string
		good                any
		extra               []badCase
	}
	groups := map[string]group{
		"hello": {"POST", "/v1/daemon/hello", enrollToken, hello, []badCase{
			{name: "missing machine_id", body: withField(hello, "machine_id", nil)},
			{name: "missing boot_id", body: withField(hello, "boot_id", nil)},
			{name: "machine_id too long", body: withField(hello, "machine_id", strings.Repeat("m", wire.MaxIDLen+1))},
			{name: "bad lane", body: withField(hello, "lanes", []string{"no spaces"})},
			{name: "too many lanes", body: withField(hello, "lanes", repeat("q", wire.MaxLanes+1))},
			{name: "max_concurrency 0", body: withField(hello, "capabilities", map[string]int{"max_concurrency": 0})},
			{name: "max_concurrency 1025", body: withField(hello, "capabilities", map[string]int{"max_concurrency": 1025})},
			{name: "bad host_key", body: withField(hello, "host_key", "hk1_abc")},
			{name: "too many tags", body: withField(hello, "tags", manyEnv(wire.MaxTags+1))},
			{name: "label too long", body: withField(hello, "label", strings.Repeat("l", wire.MaxLabelLen+1))},
			{name: "machine_id number", body: withField(hello, "machine_id", 12)},
		}},
		"poll": {"POST", "/v1/daemon/poll", a.token, poll, []badCase{
			{name: "missing worker_id", body: withField(poll, "worker_id", nil)},
			{name: "worker_id wrong prefix", body: withField(poll, "worker_id", "inv_"+strings.TrimPrefix(a.id, "wrk_"))},
			{name: "worker_id lower-case", body: withField(poll, "worker_id", strings.ToLower(a.id))},
			{name: "worker_id bad ULID", body: withField(poll, "worker_id", "wrk_123")},
			{name: "unknown phase", body: withField(poll, "phase", "resting")},
			{name: "phase booting", body: withField(poll, "phase", wire.PhaseBooting)},
			{name: "timeout_s negative", body: withField(poll, "timeout_s", -1)},
			{name: "timeout_s NaN", body: withField(poll, "timeout_s", "NaN")},
			{name: "timeout_s over an hour", body: withField(poll, "timeout_s", 3601)},
			{name: "bad invocation id", body: withField(poll, "invocations", []string{"inv_nope"})},
			{name: "too many invocations", body: withField(poll, "invocations", repeat(f.running, wire.MaxInflightIDs+1))},
			{name: "bad queue", body: withField(poll, "queue", "a#b")},
			{name: "queue too long", body: withField(poll, "queue", strings.Repeat("q", wire.MaxQueueLen+1))},
			{name: "queue not among the hello lanes", body: withField(poll, "queue", "other")},
			{name: "setup result status pending", body: withField(poll, "setup_results", []map[string]any{{"command_id": newID("cmd"), "status": "pending"}})},
			{name: "setup result output_tail too long", body: withField(poll, "setup_results", []map[string]any{{"command_id": newID("cmd"), "status": "succeeded", "output_tail": strings.Repeat("o", wire.MaxTailBytes+1)}})},
			{name: "current_invocations -1", body: withField(poll, "updated_capabilities", map[string]int{"current_invocations": -1})},
			{name: "max_concurrency 0", body: withField(poll, "updated_capabilities", map[string]int{"max_concurrency": 0})},
		}},
		"ack": {"POST", "/v1/daemon/ack", a.token, ack, []badCase{
			{name: "missing worker_id", body: withField(ack, "worker_id", nil)},
			{name: "missing invocation_id", body: withField(ack, "invocation_id", nil)},
			{name: "invocation_id lower-case", body: withField(ack, "invocation_id", "inv_"+strings.ToLower(strings.TrimPrefix(f.running, "inv_")))},
			{name: "invocation_id is a worker id", body: withField(ack, "invocation_id", a.id)},
			{name: "attempt 0", body: withField(ack, "attempt", 0)},
			{name: "attempt past the most hand-outs", body: withField(ack, "attempt", wire.MaxAttemptNumber+1)},
			{name: "state running", body: withField(ack, "state", "running")},
			{name: "state unknown", body: withField(ack, "state", "done")},
			{name: "result_blob too large", body: withField(ack, "result_blob", strings.Repeat("r", wire.MaxResultBlobBytes))},
			{name: "stdout_tail too long", body: withField(ack, "stdout_tail", strings.Repeat("o", wire.MaxTailBytes+1))},
			{name: "stderr_tail too long", body: withField(ack, "stderr_tail", strings.Repeat("e", wire.MaxTailBytes+1))},
			{name: "error without type", body: withField(ack, "error", map[string]string{"message": "x"})},
			{name: "attempt string", body: withField(ack, "attempt", "1")},
		}},
		"bye": {"POST", "/v1/daemon/bye", a.token, bye, []badCase{
			{name: "missing worker_id", body: withField(bye, "worker_id", nil)},
			{name: "unknown reason", body: withField(bye, "reason", "bored")},
			{name: "missing reason", body: withField(bye, "reason", nil)},
			{name: "inflight_abandoned negative", body: withField(bye, "inflight_abandoned", -1)},
		}},
		"submit": {"POST", "/v1/invocations", operatorToken, submit, []badCase{
			{name: "missing queue", body: withField(submit, "queue", nil)},
			{name: "queue name too long", body: withField(submit, "queue", strings.Repeat("q", wire.MaxQueueLen+1))},
			{name: "queue name bad", body: withField(submit, "queue", "my queue")},
			{name: "missing argv", body: withField(submit, "argv", nil)},
			{name: "empty argv", body: withField(submit, "argv", []string{})},
			{name: "argv too many bytes", body: withField(submit, "argv", []string{"sh", strings.Repeat("a", wire.MaxArgvBytes)})},
			{name: "argv too many items", body: withField(submit, "argv", repeat("a", wire.MaxArgvItems+1))},
			{name: "env too many entries", body: withField(submit, "env", manyEnv(wire.MaxEnvEntries+1))},
			{name: "env too many bytes", body: withField(submit, "env", map[string]string{"K": strings.Repeat("v", wire.MaxEnvBytes)})},
			{name: "env key with =", body: withField(submit, "env", map[string]string{"A=B": "c"})},
			{name: "run_config env too many bytes", body: withField(submit, "run_config", map[string]any{"env": map[string]string{"K": strings.Repeat("v", wire.MaxEnvBytes)}})},
			{name: "host_setup too many", body: withField(submit, "run_config", map[string]any{"host_setup": repeat("true", wire.MaxSetupCommands+1)})},
			{name: "run_setup empty command", body: withField(submit, "run_config", map[string]any{"run_setup": []string{""}})},
			{name: "timeout_s negative", body: withField(submit, "timeout_s", -5)},
			{name: "timeout_s over a week", body: withField(submit, "timeout_s", wire.MaxTimeoutS+1)},
			{name: "timeout_s duration string", body: withField(submit, "timeout_s", "5m")},
			{name: "max_attempts 21", body: withField(submit, "max_attempts", 21)},
			{name: "max_attempts negative", body: withField(submit, "max_attempts", -1)},
			{name: "idempotency_key too long", body: withField(submit, "idempotency_key", strings.Repeat("k", wire.MaxIDLen+1))},
		}},
		"setup": {"POST", "/v1/workers/" + a.id + "/setup", operatorToken, setup, []badCase{
			{name: "missing argv", body: `{}`},
			{name: "empty program", body: `{"argv":[""]}`},
			{name: "argv too many bytes", body: withField(setup, "argv", []string{strings.Repeat("a", wire.MaxArgvBytes+1)})},
		}},
	}

	var cases []badCase
	for name, g := range groups {
		for _, c := range bodyCases(g.good) {
			c.name = name + "/" + c.name
			c.method, c.path, c.token = g.method, g.path, g.token
			cases = append(cases, c)
		}
		for _, c := range g.extra {
			c.name = name + "/" + c.name
			c.method, c.path, c.token = g.method, g.path, g.token
			if c.status == 0 {
				c.status, c.code = 400, wire.CodeInvalid
			}
			cases = append(cases, c)
		}
	}

	inv := func(p string) badCase { return badCase{method: "GET", path: p, token: operatorToken} }
	list := []struct {
		name string
		c    badCase
	}{
		{"limit 0", inv("/v1/invocations?limit=0")},
		{"limit 501", inv("/v1/invocations?limit=501")},
		{"limit abc", inv("/v1/invocations?limit=abc")},
		{"limit negative", inv("/v1/invocations?limit=-1")},
		{"limit fraction", inv("/v1/invocations?limit=1.5")},
		{"cursor not base64", inv("/v1/invocations?cursor=!!!")},
		{"cursor abc", inv("/v1/invocations?cursor=abc")},
		{"cursor empty object", inv("/v1/invocations?cursor=" + b64(`{}`))},
		{"cursor not an object", inv("/v1/invocations?cursor=" + b64(`[1]`))},
		{"state unknown", inv("/v1/invocations?state=done")},
		{"state upper-case", inv("/v1/invocations?state=QUEUED")},
		{"queue bad", inv("/v1/invocations?queue=a%23b")},
		{"queue too long", inv("/v1/invocations?queue=" + strings.Repeat("q", 65))},
		{"id_prefix without inv_", inv("/v1/invocations?id_prefix=01M8")},
		{"id_prefix lower-case", inv("/v1/invocations?id_prefix=inv_01m8")},
		{"id_prefix a worker's", inv("/v1/invocations?id_prefix=wrk_01M8")},
		{"id_prefix bare inv_", inv("/v1/invocations?id_prefix=inv_")},
		{"id_prefix past an id", inv("/v1/invocations?id_prefix=inv_" + strings.Repeat("0", 27))},
		{"id_prefix not base32", inv("/v1/invocations?id_prefix=inv_01IL")},
		{"id_prefix with a range char", inv("/v1/invocations?id_prefix=inv_0~")},
		{"cursor across queues not an id", inv("/v1/invocations?order=newest&cursor=" + b64(`{"listed_to":"x"}`))},
		{"workers limit 0", inv("/v1/workers?limit=0")},
		{"workers limit 501", inv("/v1/workers?limit=501")},
		{"workers limit abc", inv("/v1/workers?limit=abc")},
		{"workers bad cursor", inv("/v1/workers?cursor=abc")},
	}
	for _, l := range list {
		c := l.c
		c.name, c.status, c.code = "list/"+l.name, 400, wire.CodeInvalid
		cases = append(cases, c)
	}

	wid := strings.TrimPrefix(a.id, "wrk_")
	iid := strings.TrimPrefix(f.running, "inv_")
	unknownWorker := newID("wrk")
	paths := []badCase{
		{name: "invocation id nope", method: "GET", path: "/v1/invocations/nope", status: 400, code: wire.CodeInvalid},
		{name: "invocation id lower-case", method: "GET", path: "/v1/invocations/inv_" + strings.ToLower(iid), status: 400, code: wire.CodeInvalid},
		{name: "invocation id is a worker id", method: "GET", path: "/v1/invocations/" + a.id, status: 400, code: wire.CodeInvalid},
		{name: "cancel id nope", method: "POST", path: "/v1/invocations/nope/cancel", status: 400, code: wire.CodeInvalid},
		{name: "cancel worker id", method: "POST", path: "/v1/invocations/wrk_" + iid + "/cancel", status: 400, code: wire.CodeInvalid},
		{name: "worker id is an invocation id", method: "GET", path: "/v1/workers/inv_" + wid, status: 400, code: wire.CodeInvalid},
		{name: "worker id nope", method: "GET", path: "/v1/workers/nope", status: 400, code: wire.CodeInvalid},
		{name: "drain invocation id", method: "POST", path: "/v1/workers/" + f.running + "/drain", status: 400, code: wire.CodeInvalid},
		{name: "setup invocation id", method: "POST", path: "/v1/workers/" + f.running + "/setup", body: setup, status: 400, code: wire.CodeInvalid},
		{name: "setup-results invocation id", method: "GET", path: "/v1/workers/" + f.running + "/setup-results", status: 400, code: wire.CodeInvalid},
		{name: "queue name bad", method: "GET", path: "/v1/queues/a%23b", status: 400, code: wire.CodeInvalid},
		{name: "list order sideways", method: "GET", path: "/v1/invocations?order=sideways", status: 400, code: wire.CodeInvalid},
		{name: "logs tail with after", method: "GET", path: "/v1/invocations/" + f.running + "/logs?tail=5&after=3", status: 400, code: wire.CodeInvalid},
		{name: "logs tail zero", method: "GET", path: "/v1/invocations/" + f.running + "/logs?tail=0", status: 400, code: wire.CodeInvalid},
		{name: "queue name too long", method: "GET", path: "/v1/queues/" + strings.Repeat("q", 65), status: 400, code: wire.CodeInvalid},
		{name: "unknown invocation", method: "GET", path: "/v1/invocations/" + f.unknownInv, status: 404, code: wire.CodeNotFound},
		{name: "cancel unknown invocation", method: "POST", path: "/v1/invocations/" + f.unknownInv + "/cancel", status: 404, code: wire.CodeNotFound},
		{name: "unknown worker", method: "GET", path: "/v1/workers/" + unknownWorker, status: 404, code: wire.CodeNotFound},
		{name: "drain unknown worker", method: "POST", path: "/v1/workers/" + unknownWorker + "/drain", status: 404, code: wire.CodeNotFound},
		{name: "setup unknown worker", method: "POST", path: "/v1/workers/" + unknownWorker + "/setup", body: setup, status: 404, code: wire.CodeNotFound},
		{name: "setup-results unknown worker", method: "GET", path: "/v1/workers/" + unknownWorker + "/setup-results", status: 404, code: wire.CodeNotFound},
		{name: "cancel finished invocation", method: "POST", path: "/v1/invocations/" + f.done + "/cancel", status: 409, code: wire.CodeConflict},
	}
	for _, c := range paths {
		c.name = "path/" + c.name
		c.token = operatorToken
		cases = append(cases, c)
	}

	routing := []badCase{
		{name: "unknown route", method: "GET", path: "/v1/nope", status: 404, code: wire.CodeNoRoute},
		{name: "root", method: "GET", path: "/", status: 404, code: wire.CodeNoRoute},
		{name: "unknown daemon route", method: "POST", path: "/v1/daemon/renew", body: "{}", status: 404, code: wire.CodeNoRoute},
		{name: "unknown version", method: "GET", path: "/v2/healthz", status: 404, code: wire.CodeNoRoute},
		{name: "too deep", method: "GET", path: "/v1/invocations/" + f.running + "/extra", status: 404, code: wire.CodeNoRoute},
		{name: "GET poll", method: "GET", path: "/v1/daemon/poll", status: 405, code: wire.CodeNotAllowed, allow: "POST"},
		{name: "GET hello", method: "GET", path: "/v1/daemon/hello", status: 405, code: wire.CodeNotAllowed, allow: "POST"},
		{name: "PUT ack", method: "PUT", path: "/v1/daemon/ack", body: "{}", status: 405, code: wire.CodeNotAllowed, allow: "POST"},
		{name: "POST healthz", method: "POST", path: "/v1/healthz", status: 405, code: wire.CodeNotAllowed, allow: "GET"},
		{name: "DELETE invocation", method: "DELETE", path: "/v1/invocations/" + f.running, status: 405, code: wire.CodeNotAllowed, allow: "GET"},
		{name: "GET cancel", method: "GET", path: "/v1/invocations/" + f.running + "/cancel", status: 405, code: wire.CodeNotAllowed, allow: "POST"},
		{name: "PUT drain", method: "PUT", path: "/v1/workers/" + a.id + "/drain", status: 405, code: wire.CodeNotAllowed, allow: "POST"},
		{name: "POST setup-results", method: "POST", path: "/v1/workers/" + a.id + "/setup-results", status: 405, code: wire.CodeNotAllowed, allow: "GET"},
		{name: "DELETE queue", method: "DELETE", path: "/v1/queues/default", status: 405, code: wire.CodeNotAllowed, allow: "GET"},
		{name: "PATCH workers", method: "PATCH", path: "/v1/workers", status: 405, code: wire.CodeNotAllowed, allow: "GET"},
		// /v1/invocations serves GET (list) and POST (submit): Allow must
		// name both (RFC 9110 §10.2.1).
		{name: "DELETE invocations lists GET and POST in Allow", method: "DELETE", path: "/v1/invocations", status: 405, code: wire.CodeNotAllowed, allow: "GET, POST"},
	}
	for _, c := range routing {
		c.name = "routing/" + c.name
		c.token = operatorToken
		cases = append(cases, c)
	}

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h.unchanged(t, func() {
				resp := h.do(tc.method, tc.path, tc.token, tc.body)
				resp.wantError(t, tc.status, tc.code)
				if tc.allow != "" {
					if got := strings.Join(resp.header.Values("Allow"), ", "); !sameMethods(got, tc.allow) {
						t.Errorf("Allow %q, want %q", got, tc.allow)
					}
				}
			})
		})
	}
}

// sameMethods compares two Allow header values as sets.
func sameMethods(got, want string) bool {
	set := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, p := range strings.Split(s, ",") {
			if p = strings.TrimSpace(p); p != "" {
				m[p] = true
			}
		}
		return m
	}
	g, w := set(got), set(want)
	if len(g) != len(w) {
		return false
	}
	for k := range w {
		if !g[k] {
			return false
		}
	}
	return true
}

// TestForeignCursorIsBadRequest: a cursor this API did not hand out (here,
// well-formed base64 JSON naming keys of no table) is the client's mistake
// and must be a 400, not a 503 "the store did not answer; try again" that
// invites retrying forever.
func TestForeignCursorIsBadRequest(t *testing.T) {
	h := newHarness(t)
	for range 3 {
		h.submit("x")
	}
	h.hello("m", "b")
	foreign := b64(`{"nosuch":"key"}`)
	for _, path := range []string{
		"/v1/invocations?cursor=" + foreign,
		"/v1/invocations?queue=default&cursor=" + foreign,
		"/v1/invocations?queue=default&state=queued&cursor=" + foreign,
		"/v1/workers?cursor=" + foreign,
	} {
		t.Run(path, func(t *testing.T) {
			h.unchanged(t, func() {
				h.do("GET", path, operatorToken, nil).wantError(t, 400, wire.CodeInvalid)
			})
		})
	}
}

// TestSizeLimitsAccepted: requests at every documented limit are accepted
// end to end (the store takes the item, and the daemon gets it back).
func TestSizeLimitsAccepted(t *testing.T) {
	h := newHarness(t)
	env := map[string]string{"K": strings.Repeat("e", wire.MaxEnvBytes-1)}
	req := wire.SubmitRequest{
		Queue:     strings.Repeat("q", wire.MaxQueueLen),
		Argv:      []string{"sh", strings.Repeat("a", wire.MaxArgvBytes-2)},
		Env:       env,
		RunConfig: wire.RunConfig{Env: env, HostSetup: []string{strings.Repeat("h", wire.MaxSetupBytes)}, RunSetup: []string{strings.Repeat("r", wire.MaxSetupBytes)}, Workdir: strings.Repeat("w", 1024)},
		TimeoutS:  wire.MaxTimeoutS, MaxAttempts: wire.MaxAttemptsLimit, IdempotencyKey: strings.Repeat("k", wire.MaxIDLen),
	}
	inv := h.submitReq(req)
	w := h.helloReq(wire.HelloRequest{MachineID: strings.Repeat("m", wire.MaxIDLen), BootID: strings.Repeat("b", wire.MaxIDLen),
		Label: strings.Repeat("l", wire.MaxLabelLen), Lanes: []string{req.Queue}, HostKey: inv.HostKey,
		Capabilities: wire.Capabilities{MaxConcurrency: intp(wire.MaxConcurrency)}})
	cmds := h.poll(w, wire.PollRequest{Phase: wire.PhaseReady})
	runs := ofType(cmds, wire.CommandRun)
	if len(runs) != 1 || len(runs[0].Invocation.Argv[1]) != wire.MaxArgvBytes-2 {
		t.Fatalf("claimed %d runs", len(runs))
	}
	blob := json.RawMessage(`"` + strings.Repeat("x", wire.MaxResultBlobBytes-2) + `"`)
	resp := h.ack(w, wire.AckRequest{InvocationID: inv.InvocationID, Attempt: 1, State: wire.StateFailed, ResultBlob: blob,
		Error:      &wire.ErrorInfo{Type: strings.Repeat("t", 64), Message: strings.Repeat("m", wire.MaxMessageBytes)},
		StdoutTail: strings.Repeat("o", wire.MaxTailBytes), StderrTail: strings.Repeat("e", wire.MaxTailBytes)})
	if !resp.Recorded {
		t.Fatalf("ack at the limits answered %+v", resp)
	}
	got := h.invocation(inv.InvocationID)
	if len(got.ResultBlob) != wire.MaxResultBlobBytes || len(got.StdoutTail) != wire.MaxTailBytes {
		t.Errorf("read back result_blob %d bytes, stdout_tail %d", len(got.ResultBlob), len(got.StdoutTail))
	}
}

// TestBodyExactlyAtLimitAccepted: a 256 KiB body is not refused as too large.
func TestBodyExactlyAtLimitAccepted(t *testing.T) {
	h := newHarness(t)
	b, _ := json.Marshal(wire.SubmitRequest{Queue: "default", Argv: []string{"x"}})
	body := string(b) + strings.Repeat(" ", wire.MaxBodyBytes-len(b))
	h.do("POST", "/v1/invocations", operatorToken, body).want(t, 201, nil)
}
