// Package wakelambda is the wake channel's AWS side (docs/dispatch.md): the
// handler of the WebSocket API's routes ($connect, $disconnect and the
// keep-alive on $default), and the Poster that tells a socket "poll now"
// through API Gateway's management API. `lakeshore dev` runs the same
// handler behind its own sockets (server/wake/wakesock).
package wakelambda

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/apigatewaymanagementapi"
	"github.com/aws/aws-sdk-go-v2/service/apigatewaymanagementapi/types"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/dreamlake/lakeshore/server/auth"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/shared/domain"
	"github.com/dreamlake/lakeshore/shared/wire"
)

// Connector is what the routes ask of the control plane (control.Service).
type Connector interface {
	Connect(ctx context.Context, connectionID, token, instance string) (domain.Worker, error)
	Disconnect(ctx context.Context, connectionID string) error
}

// Handler serves the WebSocket API's routes:
//   - $connect records the socket for the worker whose token the upgrade
//     request carries (Authorization: Bearer <worker token>, or
//     X-Lakeshore-Token in IAM mode); any other
//     answer than 200 makes API Gateway refuse the socket with that status.
//     In IAM mode (daemonAuth auth.DaemonAuthIAM) the route sits behind
//     AWS_IAM, and the caller API Gateway verified must be the EC2
//     instance the worker's machine_id names, as on the HTTP daemon routes;
//   - $disconnect forgets it;
//   - $default answers the daemon's keep-alive (wire.WakePing) with a pong,
//     which the route response sends back on the socket.
func Handler(c Connector, daemonAuth string, log *slog.Logger) func(context.Context, events.APIGatewayWebsocketProxyRequest) (events.APIGatewayProxyResponse, error) {
	return func(ctx context.Context, ev events.APIGatewayWebsocketProxyRequest) (events.APIGatewayProxyResponse, error) {
		id := ev.RequestContext.ConnectionID
		switch ev.RequestContext.RouteKey {
		case "$connect":
			instance, err := callerInstance(daemonAuth, ev.RequestContext.Identity)
			if err == nil {
				_, err = c.Connect(ctx, id, socketToken(ev.Headers), instance)
			}
			if err != nil {
				return refuse(log, id, err), nil
			}
			return events.APIGatewayProxyResponse{StatusCode: http.StatusOK}, nil
		case "$disconnect":
			if err := c.Disconnect(ctx, id); err != nil {
				log.Error("wake socket disconnect", "connection_id", id, "error", err.Error())
				return events.APIGatewayProxyResponse{StatusCode: http.StatusInternalServerError}, nil
			}
			return events.APIGatewayProxyResponse{StatusCode: http.StatusOK}, nil
		default:
			var msg struct{ Action string }
			if json.Unmarshal([]byte(ev.Body), &msg) != nil || msg.Action != "ping" {
				return events.APIGatewayProxyResponse{StatusCode: http.StatusBadRequest, Body: `{"message":"the wake channel only takes {\"action\":\"ping\"}"}`}, nil
			}
			pong, _ := json.Marshal(wire.WakeMessage{Type: wire.WakeTypePong})
			return events.APIGatewayProxyResponse{StatusCode: http.StatusOK, Body: string(pong)}, nil
		}
	}
}

// callerInstance reports, in IAM mode, the EC2 instance API Gateway's
// AWS_IAM authorization verified as the $connect caller ("" in token
// mode): its role session's ARN, in the request context's identity.
func callerInstance(daemonAuth string, id events.APIGatewayRequestIdentity) (string, error) {
	if daemonAuth != auth.DaemonAuthIAM {
		return "", nil
	}
	if id.UserArn == "" {
		return "", wire.Errorf(wire.CodeUnauthorized, "IAM mode: the socket carries no AWS_IAM caller identity ($connect must be signed with SigV4)")
	}
	instance, ok := auth.CallerInstance(id.UserArn)
	if !ok {
		return "", wire.Errorf(wire.CodeForbidden, "IAM mode: the caller %q is not an EC2 instance role session", id.UserArn)
	}
	return instance, nil
}

// refuse answers a $connect that failed with the error's status: 401 for a
// bad token, 410 for a gone worker, 500 when the store failed.
func refuse(log *slog.Logger, id string, err error) events.APIGatewayProxyResponse {
	status := wire.Status(wire.CodeOf(err))
	if status >= 500 {
		log.Error("wake socket connect", "connection_id", id, "error", err.Error())
	}
	body, _ := json.Marshal(wire.BodyFor(err))
	return events.APIGatewayProxyResponse{StatusCode: status, Body: string(body)}
}

// socketToken is the worker token the upgrade request carries: in
// Authorization: Bearer, or in X-Lakeshore-Token where nymph signs its
// requests with SigV4 (IAM mode moves the token there, and the signature
// takes Authorization).
func socketToken(h map[string]string) string {
	if tok := strings.TrimSpace(header(h, wire.TokenHeader)); tok != "" {
		return tok
	}
	return auth.BearerValue(header(h, "Authorization"))
}

// header reads a header case-insensitively: API Gateway passes them as the
// client spelled them.
func header(h map[string]string, name string) string {
	for k, v := range h {
		if strings.EqualFold(k, name) {
			return v
		}
	}
	return ""
}

// Management posts to sockets through API Gateway's management API at the
// WebSocket API stage's https endpoint. It is a control.Poster.
type Management struct {
	client *apigatewaymanagementapi.Client
}

// NewManagement returns a Poster for the stage at endpoint
// (https://<api>.execute-api.<region>.amazonaws.com/<stage>; locally the dev
// server's emulation of it, whose secret goes with every call in
// wire.WakeSecretHeader; "" sends none).
func NewManagement(cfg aws.Config, endpoint, secret string) Management {
	return Management{client: apigatewaymanagementapi.NewFromConfig(cfg, func(o *apigatewaymanagementapi.Options) {
		o.BaseEndpoint = aws.String(endpoint)
		if secret != "" {
			o.APIOptions = append(o.APIOptions, smithyhttp.SetHeaderValue(wire.WakeSecretHeader, secret))
		}
	})}
}

// Post sends msg to socket id; a socket API Gateway no longer has answers
// control.ErrConnectionGone.
func (m Management) Post(ctx context.Context, id string, msg []byte) error {
	_, err := m.client.PostToConnection(ctx, &apigatewaymanagementapi.PostToConnectionInput{ConnectionId: aws.String(id), Data: msg})
	return managementErr("post to "+id, err)
}

// Wake tells socket id that work for queue arrived (wire.WakeFor).
func (m Management) Wake(ctx context.Context, id, queue string) error {
	return m.Post(ctx, id, wire.WakeFor(queue))
}

// CloseConnection closes socket id (DeleteConnection); a socket API
// Gateway no longer has answers control.ErrConnectionGone.
func (m Management) CloseConnection(ctx context.Context, id string) error {
	_, err := m.client.DeleteConnection(ctx, &apigatewaymanagementapi.DeleteConnectionInput{ConnectionId: aws.String(id)})
	return managementErr("close "+id, err)
}

func managementErr(op string, err error) error {
	var gone *types.GoneException
	if errors.As(err, &gone) {
		return fmt.Errorf("%s: %w", op, control.ErrConnectionGone)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}
