// Package apilambda is the whole main of a route-group Lambda (hello, poll,
// ack, bye, api): the configuration with its tokens (from the environment or
// SSM), the router over the store, served to API Gateway events.
package apilambda

import (
	"context"
	"os"

	"github.com/aws/aws-sdk-go-v2/service/ssm"

	"github.com/dreamlake/lakeshore/shared/api"
	"github.com/dreamlake/lakeshore/shared/config"
	"github.com/dreamlake/lakeshore/shared/lambdahttp"
	"github.com/dreamlake/lakeshore/shared/lambdamain"
)

// Hook adds to a function's router configuration what only that function
// needs (the api function's submit nudge), so the others do not link it.
type Hook func(s lambdamain.Start, c *api.Config)

// Main serves the control plane's routes as the Lambda function name,
// with hooks applied to its configuration. It exits 1 when the
// configuration is incomplete (a control plane never runs without its
// tokens).
func Main(name string, hooks ...Hook) {
	s := lambdamain.Open(name)
	c, err := config.Load(context.Background(), os.Getenv, ssm.NewFromConfig(s.AWS))
	s.Check("read configuration", err)
	cfg := api.Config{
		Store:                 s.Store,
		EnrollToken:           c.EnrollToken,
		OperatorToken:         c.OperatorToken,
		PreviousEnrollToken:   c.PreviousEnrollToken,
		PreviousOperatorToken: c.PreviousOperatorToken,
		StaleAfter:            c.StaleAfter,
		DaemonAuth:            c.DaemonAuth,
		WakeURL:               c.WakeURL,
		Poster:                s.Poster,
		Metrics:               s.Metrics,
		Logger:                s.Log,
	}
	for _, h := range hooks {
		h(s, &cfg)
	}
	router, err := api.New(cfg)
	s.Check("build the router", err)
	lambdahttp.Start(router)
}
