// Command api is the Lambda behind the api route group (the operator
// routes, and nymph's artifact presign and complete: the S3 client stays
// out of the per-invocation daemon functions). It only wires: the
// routes and rules live in shared/, so the same code runs under Lambda,
// under `lakeshore dev` and in tests.
package main

import (
	"os"

	"github.com/aws/aws-sdk-go-v2/service/lambda"

	"github.com/dreamlake/lakeshore/server/api/apilambda"
	"github.com/dreamlake/lakeshore/server/blobs/blobslambda"
	"github.com/dreamlake/lakeshore/server/config"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/lambdamain"
	"github.com/dreamlake/lakeshore/server/nudge"
)

func main() { apilambda.Main("api", nudgeProvisioner, blobslambda.Hook) }

// nudgeProvisioner makes each submit nudge the provisioner function named
// by LAKESHORE_PROVISIONER_FUNCTION (set when provisioning is on): its
// hosts launch now, not at the next scheduled pass.
func nudgeProvisioner(s lambdamain.Start, c *control.Config) {
	fn := os.Getenv(config.EnvProvisionerFunction)
	if fn == "" {
		return
	}
	n := &nudge.Nudger{Invoke: nudge.InvokeFunction(lambda.NewFromConfig(s.AWS), fn), Logger: s.Log}
	c.Submitted = n.Submitted
}
