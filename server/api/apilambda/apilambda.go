// Package apilambda is the whole main of a route-group Lambda (hello, poll,
// ack, bye, api): the configuration with its tokens (from the environment or
// SSM), the router over the store, served to API Gateway events.
package apilambda

import (
	"context"
	"os"

	"github.com/aws/aws-sdk-go-v2/service/ssm"

	"github.com/dreamlake/lakeshore/server/api"
	"github.com/dreamlake/lakeshore/server/config"
	"github.com/dreamlake/lakeshore/server/lambdahttp"
	"github.com/dreamlake/lakeshore/server/lambdamain"
)

// Main serves the control plane's routes as the Lambda function name,
// its use cases built with hooks applied (lambdamain.Open). It exits 1
// when the configuration is incomplete (a control plane never runs
// without its tokens).
func Main(name string, hooks ...lambdamain.Hook) {
	s := lambdamain.Open(name, hooks...)
	c, err := config.Load(context.Background(), os.Getenv, ssm.NewFromConfig(s.AWS))
	s.Check("read configuration", err)
	router, err := api.New(api.Config{
		Control:               s.Control,
		Sessions:              s.Store,
		EnrollToken:           c.EnrollToken,
		OperatorToken:         c.OperatorToken,
		PreviousEnrollToken:   c.PreviousEnrollToken,
		PreviousOperatorToken: c.PreviousOperatorToken,
		DaemonAuth:            c.DaemonAuth,
		Logger:                s.Log,
	})
	s.Check("build the router", err)
	lambdahttp.Start(router)
}
