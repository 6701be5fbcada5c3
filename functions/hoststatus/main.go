// Command hoststatus is the Lambda that keeps workers' host_status in step
// with EC2: the one-minute schedule runs a DescribeInstances poll, and
// EventBridge "EC2 Instance State-change Notification" events are applied
// as they come. It only wires; the rules live in server/hoststatus.
package main

import (
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/dreamlake/lakeshore/server/hoststatus"
	"github.com/dreamlake/lakeshore/server/lambdamain"
)

func main() {
	s := lambdamain.Open("hoststatus")
	p := &hoststatus.Poller{Store: s.Store, Control: s.Control, EC2: ec2.NewFromConfig(s.AWS), Logger: s.Log}
	lambda.Start(p.Handle)
}
