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
	"github.com/dreamlake/lakeshore/shared/domain"
)

func main() {
	s := lambdamain.Open("provisioner")
	c, err := config.LoadProvision(os.Getenv)
	s.Check("read the provisioner's configuration", err)
	p := provision.New(provision.Config{Store: s.Store, EC2: ec2.NewFromConfig(s.AWS), LaunchTemplate: c.LaunchTemplate, Stack: c.Stack,
		Limits:     domain.ProvisionLimits{MaxHosts: c.MaxHosts, MaxHostsPerKey: c.MaxHostsPerKey},
		StaleAfter: s.Config.StaleAfter, HostSetup: s.Store.HostSetupOf, Logger: s.Log, Metrics: &metrics.EMF{W: os.Stdout}})
	lambda.Start(provision.Handler(p, s.Log))
}
