// Package embedded is the in-memory DynamoDB of `lakeshore dev` and the fast
// tests. It is its own package so the Lambdas never link it.
package embedded

import (
	"net/http"
	"sync"

	"github.com/truora/minidyn/server"
)

// Handler returns a new, empty in-memory DynamoDB (minidyn's HTTP
// server) that serves one request at a time. Serve it on a loopback port and
// reach it with store.EndpointClient: the same SDK client and code path as AWS.
//
// minidyn v0.8.2 locks its tables for item operations but not for
// CreateTable, DescribeTable, UpdateTable or DeleteTable, so a table call
// beside any other call is a data race. One request at a time makes every
// call atomic, which is also what the claim race tests rely on.
func Handler() http.Handler {
	h := server.NewServer()
	var mu sync.Mutex
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		h.ServeHTTP(w, r)
	})
}
