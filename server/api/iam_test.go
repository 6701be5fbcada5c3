package api_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/dreamlake/lakeshore/server/api"
	"github.com/dreamlake/lakeshore/server/api/apitest"
	"github.com/dreamlake/lakeshore/server/api/daemonapi"
	"github.com/dreamlake/lakeshore/server/auth"
	"github.com/dreamlake/lakeshore/server/lambdahttp"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// iamPlane is the router in IAM mode behind the Lambda handler, driven with
// the events API Gateway sends after its AWS_IAM authorizer verified the
// caller's SigV4 signature (the verification itself is API Gateway's).
type iamPlane struct {
	t       *testing.T
	handler func(context.Context, events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error)
	db      *dynamodb.Client
	prefix  string
}

func newIAMPlane(t *testing.T) *iamPlane {
	t.Helper()
	db := storetest.Embedded(t)
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(context.Background(), db, prefix); err != nil {
		t.Fatal(err)
	}
	srv, err := apitest.Build(apitest.Config{Store: store.New(db, prefix), Config: api.Config{Config: daemonapi.Config{EnrollToken: enrollToken, OperatorToken: operatorToken,
		DaemonAuth: auth.DaemonAuthIAM, Logger: slog.New(slog.DiscardHandler)}}})
	if err != nil {
		t.Fatal(err)
	}
	return &iamPlane{t: t, handler: lambdahttp.Handler(srv), db: db, prefix: prefix}
}

// instanceARN is the caller ARN of instance id's instance-profile session.
func instanceARN(id string) string {
	return "arn:aws:sts::123456789012:assumed-role/lakeshore-fleet/" + id
}

// call sends one route with the caller arn ("" for no IAM identity), the
// token in X-Lakeshore-Token and, if bearer is set, an Authorization bearer.
func (p *iamPlane) call(path, arn, token, bearer string, body any) (int, []byte) {
	p.t.Helper()
	ev := events.APIGatewayV2HTTPRequest{Version: "2.0", RawPath: path, Headers: map[string]string{"content-type": "application/json"}}
	ev.RequestContext.HTTP.Method, ev.RequestContext.HTTP.Path = "POST", path
	if arn != "" {
		ev.RequestContext.Authorizer = &events.APIGatewayV2HTTPRequestContextAuthorizerDescription{
			IAM: &events.APIGatewayV2HTTPRequestContextAuthorizerIAMDescription{UserARN: arn, AccountID: "123456789012"}}
	}
	if token != "" {
		ev.Headers["x-lakeshore-token"] = token
	}
	if bearer != "" {
		ev.Headers["authorization"] = "Bearer " + bearer
	}
	b, _ := json.Marshal(body)
	ev.Body = string(b)
	resp, err := p.handler(context.Background(), ev)
	if err != nil {
		p.t.Fatal(err)
	}
	return resp.StatusCode, []byte(resp.Body)
}

// TestIAMMode: with the AWS_IAM authorizer in front, hello and every later
// daemon call must come from the instance the machine_id names, with the
// token in X-Lakeshore-Token; a token stolen off one instance is refused
// from any other, and nothing changes on a refusal.
func TestIAMMode(t *testing.T) {
	p := newIAMPlane(t)
	const me, other = "i-0123456789abcdef0", "i-0fedcba9876543210"
	code, body := p.call("/v1/daemon/hello", instanceARN(me), enrollToken, "", wire.HelloRequest{MachineID: me, BootID: "b"})
	var hello wire.HelloResponse
	if code != 200 || json.Unmarshal(body, &hello) != nil {
		t.Fatalf("hello from its own instance: %d %s", code, body)
	}
	poll := wire.PollRequest{WorkerID: hello.WorkerID, Phase: wire.PhaseReady}
	if code, body := p.call("/v1/daemon/poll", instanceARN(me), hello.Token, "", poll); code != 200 {
		t.Fatalf("poll from its own instance: %d %s", code, body)
	}

	for _, tc := range []struct {
		name, path, arn, token, bearer string
		body                           any
		status                         int
		code                           wire.Code
	}{
		{"hello naming another instance", "/v1/daemon/hello", instanceARN(me), enrollToken, "", wire.HelloRequest{MachineID: other, BootID: "b"}, 403, wire.CodeForbidden},
		{"hello without an IAM identity", "/v1/daemon/hello", "", enrollToken, "", wire.HelloRequest{MachineID: me, BootID: "b"}, 401, wire.CodeUnauthorized},
		{"hello from an IAM user, not an instance", "/v1/daemon/hello", "arn:aws:iam::123456789012:user/bob", enrollToken, "", wire.HelloRequest{MachineID: me, BootID: "b"}, 403, wire.CodeForbidden},
		{"hello from a role session not named for an instance", "/v1/daemon/hello", "arn:aws:sts::123456789012:assumed-role/admin/" + me + "-x", enrollToken, "", wire.HelloRequest{MachineID: me, BootID: "b"}, 403, wire.CodeForbidden},
		{"hello with the token in Authorization only", "/v1/daemon/hello", instanceARN(me), "", enrollToken, wire.HelloRequest{MachineID: me, BootID: "b"}, 401, wire.CodeUnauthorized},
		{"hello without the enrollment token", "/v1/daemon/hello", instanceARN(me), "", "", wire.HelloRequest{MachineID: me, BootID: "b"}, 401, wire.CodeUnauthorized},
		{"stolen worker token polled from another instance", "/v1/daemon/poll", instanceARN(other), hello.Token, "", poll, 403, wire.CodeForbidden},
		{"stolen worker token acks from another instance", "/v1/daemon/ack", instanceARN(other), hello.Token, "",
			wire.AckRequest{WorkerID: hello.WorkerID, InvocationID: "inv_01M8N05PBD2Q3B23M9J8PAHEBB", Attempt: 1, State: wire.StateSucceeded}, 403, wire.CodeForbidden},
		{"stolen worker token says bye from another instance", "/v1/daemon/bye", instanceARN(other), hello.Token, "",
			wire.ByeRequest{WorkerID: hello.WorkerID, Reason: wire.ByeIdle}, 403, wire.CodeForbidden},
		{"poll with the token in Authorization only", "/v1/daemon/poll", instanceARN(me), "", hello.Token, poll, 401, wire.CodeUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := storetest.TakeSnapshot(t, p.db, p.prefix)
			code, body := p.call(tc.path, tc.arn, tc.token, tc.bearer, tc.body)
			var eb wire.ErrorBody
			_ = json.Unmarshal(body, &eb)
			if code != tc.status || eb.Error.Code != tc.code {
				t.Errorf("got %d %s, want %d %s: %s", code, eb.Error.Code, tc.status, tc.code, body)
			}
			if d := before.Diff(storetest.TakeSnapshot(t, p.db, p.prefix)); d != "" {
				t.Errorf("a refused request changed the store:\n%s", d)
			}
		})
	}
	if code, body := p.call("/v1/daemon/bye", instanceARN(me), hello.Token, "", wire.ByeRequest{WorkerID: hello.WorkerID, Reason: wire.ByeIdle}); code != 204 {
		t.Fatalf("bye from its own instance: %d %s", code, body)
	}
}

// TestIAMModeRefusesUnknownMode: a typo in the mode is a start-up error,
// never a silently open or silently token-only control plane.
func TestIAMModeRefusesUnknownMode(t *testing.T) {
	_, err := apitest.Build(apitest.Config{Store: &store.Store{}, Config: api.Config{Config: daemonapi.Config{EnrollToken: "e", OperatorToken: "o", DaemonAuth: "IAM"}}})
	if err == nil {
		t.Fatal("api.New accepted daemon auth \"IAM\"")
	}
}
