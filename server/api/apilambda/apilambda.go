// Package apilambda is the whole main of a route-group Lambda (hello, poll,
// ack, bye, api): the configuration with its tokens (from the environment or
// SSM), a router over the store, served to API Gateway events. It links
// only the daemon routes' router (daemonapi): the api function's main hands
// it the whole router, so the daemon functions never link the web view.
package apilambda

import (
	"context"
	"net/http"
	"os"

	"github.com/aws/aws-sdk-go-v2/service/ssm"

	"github.com/dreamlake/lakeshore/server/api/daemonapi"
	"github.com/dreamlake/lakeshore/server/config"
	"github.com/dreamlake/lakeshore/server/lambdahttp"
	"github.com/dreamlake/lakeshore/server/lambdamain"
)

// Router builds a function's router from its start and the routes'
// configuration (its tokens read).
type Router func(s lambdamain.Start, c daemonapi.Config) (http.Handler, error)

// Daemon is the router of the daemon functions (hello, poll, ack, bye):
// the daemon routes alone.
func Daemon(_ lambdamain.Start, c daemonapi.Config) (http.Handler, error) {
	return daemonapi.New(c)
}

// Main serves router's routes as the Lambda function name, its use cases
// built with hooks applied (lambdamain.Open). It exits 1 when the
// configuration is incomplete (a control plane never runs without its
// tokens).
func Main(name string, router Router, hooks ...lambdamain.Hook) {
	s := lambdamain.Open(name, hooks...)
	c, err := config.Load(context.Background(), os.Getenv, ssm.NewFromConfig(s.AWS))
	s.Check("read configuration", err)
	h, err := router(s, daemonapi.Config{
		Control:               s.Control,
		EnrollToken:           c.EnrollToken,
		OperatorToken:         c.OperatorToken,
		PreviousEnrollToken:   c.PreviousEnrollToken,
		PreviousOperatorToken: c.PreviousOperatorToken,
		DaemonAuth:            c.DaemonAuth,
		Logger:                s.Log,
	})
	s.Check("build the router", err)
	lambdahttp.Start(h)
}
