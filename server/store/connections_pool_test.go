package store_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/server/store"
)

// TestSharedConnectionsKeepsThem: two rounds of 20 requests in flight at
// once. With SharedConnections(32) the second round reuses the first's 20
// connections; with the SDK's default pool (10 idle) it dials 10 more.
// A connection goes back to the client's pool just after its request
// returns (the transport's own goroutine puts it there), so a second
// round that starts at once can still find one or two not back yet and
// dial for them: the shared pool is held to at most 3 such dials (CI
// under -race saw 1), the default one to at least its 10.
func TestSharedConnectionsKeepsThem(t *testing.T) {
	const inFlight = 20
	for _, c := range []struct {
		name     string
		opts     []func(*dynamodb.Options)
		min, max int64
	}{
		{"shared", []func(*dynamodb.Options){store.SharedConnections(32)}, inFlight, inFlight + 3},
		{"default", nil, inFlight + inFlight - 10, 2 * inFlight},
	} {
		t.Run(c.name, func(t *testing.T) {
			var conns atomic.Int64
			var mu sync.Mutex
			waiting, release := 0, make(chan struct{})
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// Answer only once inFlight requests are held: each has a
				// connection of its own.
				mu.Lock()
				if waiting++; waiting == inFlight {
					close(release)
					waiting, release = 0, make(chan struct{})
					mu.Unlock()
				} else {
					ch := release
					mu.Unlock()
					select {
					case <-ch:
					case <-time.After(30 * time.Second):
					}
				}
				w.Header().Set("Content-Type", "application/x-amz-json-1.0")
				_, _ = w.Write([]byte(`{}`))
			}))
			srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
				if st == http.StateNew {
					conns.Add(1)
				}
			}
			srv.Start()
			defer srv.Close()
			db := store.EndpointClient(srv.URL, c.opts...)
			for round := range 2 {
				var wg sync.WaitGroup
				for range inFlight {
					wg.Go(func() {
						_, err := db.GetItem(context.Background(), &dynamodb.GetItemInput{TableName: aws.String("t"),
							Key: map[string]types.AttributeValue{"k": &types.AttributeValueMemberS{Value: "v"}}})
						if err != nil {
							t.Errorf("round %d: %v", round, err)
						}
					})
				}
				wg.Wait()
			}
			if got := conns.Load(); got < c.min || got > c.max {
				t.Fatalf("%d connections for two rounds of %d; want %d to %d", got, inFlight, c.min, c.max)
			}
		})
	}
}
