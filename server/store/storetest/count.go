package storetest

import (
	"context"
	"fmt"
	"maps"
	"sync"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"

	"github.com/dreamlake/lakeshore/server/store"
)

// Counter counts DynamoDB requests by operation name ("PutItem", "Query",
// …). Emulators report no real consumed capacity (moto answers zeros,
// minidyn nothing), so the number of requests is what tests and benchmarks
// measure a store operation's cost by. The zero value is ready to use, and a
// Counter is safe for concurrent use.
type Counter struct {
	mu sync.Mutex
	n  map[string]int
}

// Add counts one request of operation op.
func (c *Counter) Add(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[op]++
}

// Get reports how many requests of operation op were counted.
func (c *Counter) Get(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[op]
}

// Snapshot reports the counts so far, by operation name. The map is a copy
// the caller owns.
func (c *Counter) Snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.n))
	maps.Copy(out, c.n)
	return out
}

// Total reports how many requests were counted, over every operation.
func (c *Counter) Total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	total := 0
	for _, n := range c.n {
		total += n
	}
	return total
}

// Reset sets every count back to zero.
func (c *Counter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.n)
}

// CountRequests returns a DynamoDB client option that counts every request
// the client sends in counter (store.OnRequest: once per HTTP attempt,
// refused ones included). Give it to dynamodb.New / NewFromConfig, or to a
// single call. Its hook is named after the counter, so one client may
// carry several counters but not the same one twice.
func CountRequests(counter *Counter) func(*dynamodb.Options) {
	return store.OnRequest(fmt.Sprintf("storetest.CountRequests(%p)", counter), counter.Add)
}

// CountCalls returns a DynamoDB client option that counts every call made
// through the client in counter, once however many HTTP attempts the SDK's
// retryer makes for it (CountRequests counts those). A test that asks "how
// many requests does this path make" of a path's code, not of the network's
// luck, counts calls: one retried attempt would otherwise read as a path that
// grew. Its id names the counter, as CountRequests's does.
func CountCalls(counter *Counter) func(*dynamodb.Options) {
	id := fmt.Sprintf("storetest.CountCalls(%p)", counter)
	return func(o *dynamodb.Options) {
		o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
			return stack.Initialize.Add(middleware.InitializeMiddlewareFunc(id,
				func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
					counter.Add(awsmiddleware.GetOperationName(ctx))
					return next.HandleInitialize(ctx, in)
				}), middleware.After)
		})
	}
}

// CountingClient returns a copy of db whose requests are also counted in
// counter; db itself is left as it was.
func CountingClient(db *dynamodb.Client, counter *Counter) *dynamodb.Client {
	return dynamodb.New(db.Options(), CountRequests(counter))
}
