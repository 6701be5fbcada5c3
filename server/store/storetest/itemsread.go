package storetest

import (
	"context"
	"fmt"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"
)

// AddN counts n of operation op (items, rather than requests).
func (c *Counter) AddN(op string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[op] += n
}

// CountItemsRead returns a DynamoDB client option that counts, in counter,
// the items each Query and Scan read (its ScannedCount: what DynamoDB bills
// read units for, also when Select is COUNT and no item is returned) and
// each BatchGetItem found, by
// operation name. A request that answers no more than a count reads as
// many items as it counted, so it is what a read's cost grows with even
// when the number of requests does not (one page holds up to 1 MB).
func CountItemsRead(counter *Counter) func(*dynamodb.Options) {
	id := fmt.Sprintf("storetest.CountItemsRead(%p)", counter)
	return func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
			return stack.Initialize.Add(middleware.InitializeMiddlewareFunc(id,
				func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
					out, md, err := next.HandleInitialize(ctx, in)
					op := awsmiddleware.GetOperationName(ctx)
					switch r := out.Result.(type) {
					case *dynamodb.QueryOutput:
						counter.AddN(op, int(max(r.ScannedCount, r.Count)))
					case *dynamodb.ScanOutput:
						counter.AddN(op, int(max(r.ScannedCount, r.Count)))
					case *dynamodb.BatchGetItemOutput:
						n := 0
						for _, items := range r.Responses {
							n += len(items)
						}
						counter.AddN(op, n)
					}
					return out, md, err
				}), middleware.After)
		})
	}
}
