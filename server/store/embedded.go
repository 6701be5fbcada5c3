package store

import (
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// EmbeddedRegion is the region of clients made by EndpointClient.
const EmbeddedRegion = "us-east-1"

// EndpointClient returns a DynamoDB client for an emulator endpoint such as
// "http://127.0.0.1:5000", with static dummy credentials. It ignores the
// environment (AWS_PROFILE, AWS_ENDPOINT_URL, …), so it always talks to the
// endpoint it was given. opts apply after the endpoint's.
func EndpointClient(endpoint string, opts ...func(*dynamodb.Options)) *dynamodb.Client {
	cfg := aws.Config{
		Region:      EmbeddedRegion,
		Credentials: credentials.NewStaticCredentialsProvider("local", "local", ""),
	}
	return dynamodb.NewFromConfig(cfg, append([]func(*dynamodb.Options){func(o *dynamodb.Options) {
		o.BaseEndpoint = aws.String(endpoint)
	}}, opts...)...)
}

// ServerPool is how many idle connections to the store a process that
// serves many requests at once keeps (SharedConnections).
const ServerPool = 256

// SharedConnections has a client keep up to n idle connections to its
// endpoint, for a process that serves many requests at once (`lakeshore
// dev`: a thousand workers' polls go through one client). The SDK's
// default keeps 10: past ten requests in flight, each one that ends closes
// its connection and a later one dials a new one, which costs both
// processes CPU (a TCP handshake, a goroutine each side, a socket in
// TIME_WAIT) on every request over the ten. A Lambda instance serves one
// request at a time and keeps the default.
func SharedConnections(n int) func(*dynamodb.Options) {
	return func(o *dynamodb.Options) {
		o.HTTPClient = awshttp.NewBuildableClient().WithTransportOptions(func(tr *http.Transport) {
			tr.MaxIdleConns, tr.MaxIdleConnsPerHost = n, n
		})
	}
}
