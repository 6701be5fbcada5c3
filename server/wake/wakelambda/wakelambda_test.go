package wakelambda

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/dreamlake/lakeshore/server/auth"
	"github.com/dreamlake/lakeshore/server/store/storetest"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// fakeConnector accepts one token and records what the routes asked.
type fakeConnector struct {
	token        string
	connected    []string
	disconnected []string
}

func (f *fakeConnector) Connect(_ context.Context, id, token, _ string) (domain.Worker, error) {
	if token != f.token {
		return domain.Worker{}, wire.Errorf(wire.CodeUnauthorized, "worker token is not valid")
	}
	f.connected = append(f.connected, id)
	return domain.Worker{ID: "wrk_1"}, nil
}

func (f *fakeConnector) Disconnect(_ context.Context, id string) error {
	f.disconnected = append(f.disconnected, id)
	return nil
}

func event(route, id string, headers map[string]string, body string) events.APIGatewayWebsocketProxyRequest {
	return events.APIGatewayWebsocketProxyRequest{Headers: headers, Body: body,
		RequestContext: events.APIGatewayWebsocketProxyRequestContext{RouteKey: route, ConnectionID: id}}
}

// TestRoutes: $connect takes the worker token from a Bearer header, or
// from X-Lakeshore-Token when the request is SigV4-signed (IAM mode, where
// the signature holds Authorization); a bad token is refused with its
// status and no socket recorded; $disconnect forgets; the keep-alive is
// answered with a pong and anything else refused.
func TestRoutes(t *testing.T) {
	ctx := context.Background()
	f := &fakeConnector{token: "wtk_good"}
	h := Handler(f, auth.DaemonAuthToken, slog.New(slog.DiscardHandler))
	for _, tc := range []struct {
		name    string
		headers map[string]string
		status  int
	}{
		{"bearer", map[string]string{"Authorization": "Bearer wtk_good"}, http.StatusOK},
		{"IAM mode", map[string]string{"authorization": "AWS4-HMAC-SHA256 Credential=x", "x-lakeshore-token": "wtk_good"}, http.StatusOK},
		{"bad token", map[string]string{"Authorization": "Bearer wtk_bad"}, http.StatusUnauthorized},
		{"none", nil, http.StatusUnauthorized},
	} {
		resp, err := h(ctx, event("$connect", "c-"+tc.name, tc.headers, ""))
		if err != nil || resp.StatusCode != tc.status {
			t.Errorf("%s: $connect = %d %v, want %d", tc.name, resp.StatusCode, err, tc.status)
		}
	}
	if len(f.connected) != 2 {
		t.Fatalf("connected %v, want the bearer and IAM-mode sockets", f.connected)
	}
	if resp, _ := h(ctx, event("$disconnect", "c-bearer", nil, "")); resp.StatusCode != http.StatusOK || len(f.disconnected) != 1 {
		t.Fatalf("$disconnect = %d, disconnected %v", resp.StatusCode, f.disconnected)
	}
	resp, _ := h(ctx, event("$default", "c-IAM mode", nil, wire.WakePing))
	var pong wire.WakeMessage
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(resp.Body), &pong) != nil || pong.Type != wire.WakeTypePong {
		t.Fatalf("ping answered %d %q, want a pong", resp.StatusCode, resp.Body)
	}
	if resp, _ := h(ctx, event("$default", "c-IAM mode", nil, `{"action":"claim"}`)); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("another action answered %d, want 400", resp.StatusCode)
	}
}

// TestConnectIsBoundToTheInstanceInIAMMode: in IAM mode $connect sits
// behind AWS_IAM, and the caller identity API Gateway puts in the request
// context must be the EC2 instance the worker's machine_id names, as on
// the HTTP daemon routes: the worker's own instance connects; a stolen
// token from another instance, from a caller that is no instance role
// session, or without an identity at all is refused, and no socket is
// recorded. (Crafted request contexts: AWS_IAM itself needs AWS.)
func TestConnectIsBoundToTheInstanceInIAMMode(t *testing.T) {
	ctx := context.Background()
	st, _ := storetest.Store(t)
	svc := storetest.Control(st)
	const instance = "i-0123456789abcdef0"
	var token string
	hello, err := svc.Hello(ctx, wire.HelloRequest{MachineID: instance, BootID: "b", Lanes: []string{"q"}}.Registration(), func(id string) (string, error) {
		tok, hash, err := auth.NewWorkerToken(id)
		token = tok
		return hash, err
	})
	if err != nil {
		t.Fatal(err)
	}
	h := Handler(svc, auth.DaemonAuthIAM, slog.New(slog.DiscardHandler))
	role := func(session string) string {
		return "arn:aws:sts::123456789012:assumed-role/lakeshore-fleet/" + session
	}
	for _, tc := range []struct {
		name, callerARN string
		status          int
	}{
		{"no caller identity", "", http.StatusUnauthorized},
		{"an IAM user", "arn:aws:iam::123456789012:user/mallory", http.StatusForbidden},
		{"another instance", role("i-0fedcba9876543210"), http.StatusForbidden},
		{"a session named like the instance in another shape", role(instance + "-x"), http.StatusForbidden},
		{"the worker's instance", role(instance), http.StatusOK},
	} {
		ev := event("$connect", "c-"+tc.name, map[string]string{"Authorization": "AWS4-HMAC-SHA256 Credential=x", wire.TokenHeader: token}, "")
		ev.RequestContext.Identity.UserArn = tc.callerARN
		resp, err := h(ctx, ev)
		if err != nil || resp.StatusCode != tc.status {
			t.Errorf("%s: $connect = %d %v, want %d", tc.name, resp.StatusCode, err, tc.status)
		}
	}
	conns, err := st.Connections(ctx, "q#")
	if err != nil || len(conns) != 1 || conns[0].ID != "c-the worker's instance" || conns[0].WorkerID != hello.Worker.ID {
		t.Fatalf("recorded sockets %+v %v; want only the one from the worker's instance", conns, err)
	}
}
