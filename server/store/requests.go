package store

import (
	"context"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"
)

// OnRequest returns a DynamoDB client option that calls fn with the
// operation name ("PutItem", "Query", …) of every request the client
// sends: `lakeshore dev`'s /metrics counts them, and the tests measure a
// path's cost by them. name names the hook in the SDK's stack, so one
// client may carry several hooks, each under its own name.
//
// The hook sits at the end of the finalize step, inside the SDK's retry
// loop, so it sees HTTP requests: a call the SDK retries counts once per
// attempt, and a request the store refuses (a failed condition, a
// cancelled transaction) counts like any other, because it cost a round
// trip all the same.
func OnRequest(name string, fn func(op string)) func(*dynamodb.Options) {
	return func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
			return stack.Finalize.Add(middleware.FinalizeMiddlewareFunc(name,
				func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
					fn(awsmiddleware.GetOperationName(ctx))
					return next.HandleFinalize(ctx, in)
				}), middleware.After)
		})
	}
}
