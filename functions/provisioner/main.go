// Command provisioner launches EC2 hosts for queued work no live worker can
// take (docs/provision.md), on a schedule. It only wires: the pass lives in
// server/provision.
package main

import (
	"os"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/dreamlake/lakeshore/server/config"
	"github.com/dreamlake/lakeshore/server/lambdamain"
	"github.com/dreamlake/lakeshore/server/metrics"
	"github.com/dreamlake/lakeshore/server/provision"
)

func main() {
	s := lambdamain.Open("provisioner")
	c, err := config.LoadProvision(os.Getenv)
	s.Check("read the provisioner's configuration", err)
	pc := provision.ConfigOf(c)
	pc.Store, pc.EC2, pc.StaleAfter, pc.HostSetup = s.Store, ec2.NewFromConfig(s.AWS), s.Config.StaleAfter, s.Store.HostSetupOf
	pc.Logger, pc.Metrics = s.Log, &metrics.EMF{W: os.Stdout}
	p := provision.New(pc)
	lambda.Start(provision.Handler(p, s.Log))
}
