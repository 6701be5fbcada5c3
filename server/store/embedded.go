package store

import (
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// EmbeddedRegion is the region of clients made by EndpointClient.
const EmbeddedRegion = "us-east-1"

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
