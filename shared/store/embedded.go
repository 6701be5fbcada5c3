package store

import (
	"net/http"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/truora/minidyn/server"
)

// EmbeddedRegion is the region of clients made by EndpointClient.
const EmbeddedRegion = "us-east-1"

// EmbeddedHandler returns a new, empty in-memory DynamoDB (minidyn's HTTP
// server) that serves one request at a time. Serve it on a loopback port and
// reach it with EndpointClient: the same SDK client and code path as AWS.
//
// minidyn v0.8.2 locks its tables for item operations but not for
// CreateTable, DescribeTable, UpdateTable or DeleteTable, so a table call
// beside any other call is a data race. One request at a time makes every
// call atomic, which is also what the claim race tests rely on.
func EmbeddedHandler() http.Handler {
	h := server.NewServer()
	var mu sync.Mutex
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

// EndpointClient returns a DynamoDB client for an emulator endpoint such as
// "http://127.0.0.1:5000", with static dummy credentials. It ignores the
// environment (AWS_PROFILE, AWS_ENDPOINT_URL, …), so it always talks to the
// endpoint it was given.
func EndpointClient(endpoint string) *dynamodb.Client {
	cfg := aws.Config{
		Region:      EmbeddedRegion,
		Credentials: credentials.NewStaticCredentialsProvider("local", "local", ""),
	}
	return dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
		o.BaseEndpoint = aws.String(endpoint)
	})
}
