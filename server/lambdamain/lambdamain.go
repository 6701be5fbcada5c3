// Package lambdamain is the start of every Lambda main: a JSON logger, the
// AWS SDK's configuration, the control plane's (server/config), a store
// over them and the use cases over the store (server/control). A configuration that is incomplete or malformed ends the
// process with exit 1, so a misconfigured deploy fails its INIT instead of
// answering requests. It links no handler: each functions/*/main.go wires
// the one it serves, so the reaper does not carry the router.
package lambdamain

import (
	"context"
	"log/slog"
	"os"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/dreamlake/lakeshore/server/config"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/metrics"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/wake/wakelambda"
	"github.com/dreamlake/lakeshore/shared/logjson"
)

// Start is what a function has once it has started.
type Start struct {
	Name   string
	Log    *slog.Logger
	AWS    aws.Config
	Config config.Config
	Store  *store.Store
	// Poster posts to the wake channel's sockets (nil: no wake channel).
	Poster control.Poster
	// Metrics writes the use cases' events as CloudWatch Embedded Metric
	// Format lines to stdout (docs/metrics.md).
	Metrics *metrics.EMF
	// Control runs the use cases over Store with the configured stale
	// window, wake channel and metrics.
	Control *control.Service
}

// Hook adds to the use cases' configuration what only one function needs
// (the api function's submit nudge), so the others do not link it.
type Hook func(s Start, c *control.Config)

// Open starts function name: the table prefix, the stale window and the
// wake channel (no tokens: a route function reads those itself), and the
// one Service of the process, built with hooks applied.
func Open(name string, hooks ...Hook) Start {
	s := Start{Name: name, Log: logjson.New(os.Stdout, slog.LevelInfo)}
	awsCfg, err := awsconfig.LoadDefaultConfig(context.Background(), awsconfig.WithLogger(logjson.SDK(s.Log)))
	s.Check("load AWS config", err)
	c, err := config.LoadStore(os.Getenv)
	s.Check("read configuration", err)
	s.AWS, s.Config = awsCfg, c
	s.Store = store.New(dynamodb.NewFromConfig(awsCfg), c.TablePrefix)
	s.Store.ClaimShards = c.ClaimShards
	// Each instance is one of many claiming the same queues, one poll at a
	// time: its claims read from random points of a queue, not its head.
	s.Store.SpreadClaims = true
	if c.WakeEndpoint != "" {
		s.Poster = wakelambda.NewManagement(awsCfg, c.WakeEndpoint, c.WakeSecret)
	}
	s.Metrics = &metrics.EMF{W: os.Stdout}
	cc := control.Config{Store: s.Store, StaleAfter: c.StaleAfter, Logger: s.Log, WakeURL: c.WakeURL,
		Poster: s.Poster, Metrics: s.Metrics, WorkerRetention: s.Store.WorkerRetention}
	for _, h := range hooks {
		h(s, &cc)
	}
	s.Control = control.New(cc)
	return s
}

// Check ends the process (exit 1) when err is set, logging what failed.
func (s Start) Check(what string, err error) {
	if err != nil {
		s.Log.Error(s.Name+": "+what, "error", err.Error())
		os.Exit(1)
	}
}
