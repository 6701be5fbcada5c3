// Package embedded is the in-memory DynamoDB of `lakeshore dev` and the fast
// tests. It is its own package so the Lambdas never link it.
package embedded

import (
	"bytes"
	"hash/crc32"
	"net/http"
	"strconv"
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
		// DynamoDB sends X-Amz-Crc32 with every answer and the SDK checks
		// it; minidyn sends none, and the SDK then warns on every call.
		rec := &recorder{header: w.Header(), code: http.StatusOK}
		h.ServeHTTP(rec, r)
		w.Header().Set("X-Amz-Crc32", strconv.FormatUint(uint64(crc32.ChecksumIEEE(rec.body.Bytes())), 10))
		w.WriteHeader(rec.code)
		_, _ = w.Write(rec.body.Bytes())
	})
}

// recorder holds an answer back until its checksum is known.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header         { return r.header }
func (r *recorder) WriteHeader(code int)        { r.code = code }
func (r *recorder) Write(p []byte) (int, error) { return r.body.Write(p) }
