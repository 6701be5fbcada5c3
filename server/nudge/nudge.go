// Package nudge asks for a provisioner pass right after a submit on AWS
// (docs/provision.md, "Turning it on"): an asynchronous invoke of the
// provisioner function, at most once per DefaultEvery per process. It is
// its own package so the api function links the Lambda client and not the
// provisioner's EC2 one.
package nudge

import (
	"cmp"
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	lambdatypes "github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/dreamlake/lakeshore/shared/clock"
	"github.com/dreamlake/lakeshore/shared/domain"
)

// Nudge defaults.
const (
	// DefaultEvery is the least time between two nudges of one
	// process: a burst of submits asks for one pass.
	DefaultEvery = 10 * time.Second
	nudgeTimeout = 2 * time.Second
)

// Payload is the event a nudge invokes the provisioner with (a pass
// reads no event; this one says where it came from, for its log).
const Payload = `{"source":"lakeshore.submit"}`

// Nudger asks for a provisioner pass soon after a submit, so the work does
// not wait for the schedule (a minute on AWS): the api function calls
// Submitted after each submit, and at most once per Every it runs Invoke
// (InvokeFunction: an asynchronous invoke of the provisioner function).
// A nudge that fails is logged, never the submit's error: the schedule
// still runs the pass.
type Nudger struct {
	Invoke func(ctx context.Context) error
	Every  time.Duration
	Clock  clock.Clock
	Logger *slog.Logger

	mu   sync.Mutex
	last time.Time
}

// Submitted nudges for inv (control.Config.Submitted). It waits for the
// invoke, bounded: a Lambda may be frozen once it answers, so nothing may
// be left running after it.
func (n *Nudger) Submitted(ctx context.Context, inv domain.Invocation) {
	now := n.Clock.Now()
	n.mu.Lock()
	if !n.last.IsZero() && now.Sub(n.last) < cmp.Or(n.Every, DefaultEvery) {
		n.mu.Unlock()
		return
	}
	n.last = now
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), nudgeTimeout)
	defer cancel()
	if err := n.Invoke(ctx); err != nil && n.Logger != nil {
		n.Logger.Warn("provision: nudge after a submit failed; the schedule's pass will see the work",
			"invocation_id", inv.ID, "error", err.Error())
	}
}

// Invoker is the part of the Lambda API a nudge calls.
type Invoker interface {
	Invoke(ctx context.Context, in *lambda.InvokeInput, optFns ...func(*lambda.Options)) (*lambda.InvokeOutput, error)
}

// InvokeFunction invokes function (its name or ARN) asynchronously
// (InvocationType Event: Lambda queues it and answers at once).
func InvokeFunction(c Invoker, function string) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := c.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(function),
			InvocationType: lambdatypes.InvocationTypeEvent, Payload: []byte(Payload)})
		return err
	}
}
