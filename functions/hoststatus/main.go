// Command hoststatus is the Lambda that keeps workers' host_status in step
// with EC2: the one-minute schedule runs a DescribeInstances poll, and
// EventBridge "EC2 Instance State-change Notification" events are applied
// as they come. It only wires; the rules live in shared/hoststatus.
package main

import (
	"context"
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/dreamlake/lakeshore/shared/hoststatus"
	"github.com/dreamlake/lakeshore/shared/store"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	prefix := os.Getenv("LAKESHORE_TABLE_PREFIX")
	if prefix == "" {
		prefix = "lakeshore-"
	}
	cfg, err := awsconfig.LoadDefaultConfig(context.Background())
	if err != nil {
		log.Error("hoststatus: load AWS config", "error", err.Error())
		os.Exit(1)
	}
	p := &hoststatus.Poller{
		Store:  store.New(dynamodb.NewFromConfig(cfg), prefix),
		EC2:    ec2.NewFromConfig(cfg),
		Logger: log,
	}
	lambda.Start(p.Handle)
}
