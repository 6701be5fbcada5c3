package sigv4

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/dreamlake/lakeshore/agent/internal/imds/imdstest"
	"github.com/dreamlake/lakeshore/agent/internal/sigv4/sigv4test"
	"github.com/dreamlake/lakeshore/agent/internal/wakeclient"
	"github.com/dreamlake/lakeshore/server/wake/wakesock"
	"github.com/dreamlake/lakeshore/shared/waittest"
)

// TestSignsTheWakeSocket: in IAM mode nymph signs its wake socket's
// WebSocket upgrade with the instance role for the wake channel's own host
// (another host than the control plane's), over the host, the date, the
// session token and the worker token in X-Lakeshore-Token, not over the
// hop-by-hop upgrade headers. The front (a sigv4test.Plane) re-verifies the signature as
// API Gateway's AWS_IAM authorization would before the socket reaches the
// $connect route. The client is the agent loop's wiring: WakeClient over
// the agent's signing client.
func TestSignsTheWakeSocket(t *testing.T) {
	f := imdstest.New(t, imdstest.State{Region: "eu-west-3"})
	hc := newTestClient(t, "http://127.0.0.1:1", f.URL)
	sockets := wakesock.New("/wake", "", func(_ context.Context, ev events.APIGatewayWebsocketProxyRequest) (events.APIGatewayProxyResponse, error) {
		if ev.RequestContext.RouteKey == "$connect" && ev.Headers["X-Lakeshore-Token"] != "wtk_w" {
			return events.APIGatewayProxyResponse{StatusCode: http.StatusUnauthorized}, nil
		}
		return events.APIGatewayProxyResponse{StatusCode: http.StatusOK}, nil
	}, slog.New(slog.DiscardHandler))
	defer sockets.Close()
	front := sigv4test.NewPlane(t, "eu-west-3", sockets)

	c := wakeclient.New(wakeclient.Options{Logger: slog.New(slog.DiscardHandler), BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
		HTTPFor: func(url string) *http.Client { return WakeClient(hc, url) }})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.Run(ctx)
	c.Use(front.WebSocketURL("/wake"), "wtk_w")
	waittest.Until(t, 30*time.Second, "the signed wake socket up", c.Up)

	for _, up := range front.Check(t) {
		if up.SignedHeaders != "host;x-amz-date;x-amz-security-token;x-lakeshore-token" {
			t.Errorf("the upgrade signed %q; want only host, date, session token and the token header", up.SignedHeaders)
		}
	}
}
