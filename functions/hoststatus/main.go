// Command hoststatus is the Lambda that keeps workers' host_status in step
// with EC2: the one-minute schedule runs a DescribeInstances poll, and
// EventBridge "EC2 Instance State-change Notification" events are applied
// as they come. It only wires; the rules live in shared/hoststatus.
package main

import (
	"log/slog"
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/dreamlake/lakeshore/shared/config"
	"github.com/dreamlake/lakeshore/shared/hoststatus"
)

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stdout, nil))
	st, awsCfg, _ := config.OpenStore("hoststatus", log)
	p := &hoststatus.Poller{Store: st, EC2: ec2.NewFromConfig(awsCfg), Logger: log}
	lambda.Start(p.Handle)
}
