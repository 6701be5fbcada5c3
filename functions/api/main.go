// Command api is the Lambda behind the api route group (the operator
// routes, and nymph's artifact presign and complete: the S3 client stays
// out of the per-invocation daemon functions). It only wires: the
// routes and rules live in shared/, so the same code runs under Lambda,
// under `lakeshore dev` and in tests.
package main

import (
	"net/http"
	"os"

	"github.com/aws/aws-sdk-go-v2/service/lambda"

	"github.com/dreamlake/lakeshore/server/api"
	"github.com/dreamlake/lakeshore/server/api/apilambda"
	"github.com/dreamlake/lakeshore/server/api/daemonapi"
	"github.com/dreamlake/lakeshore/server/blobs/blobslambda"
	"github.com/dreamlake/lakeshore/server/config"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/lambdamain"
	"github.com/dreamlake/lakeshore/server/nudge"
)

func main() { apilambda.Main("api", router, nudgeProvisioner, blobslambda.Hook) }

// router is the whole wire API and the web view, its sessions in the store.
func router(s lambdamain.Start, c daemonapi.Config) (http.Handler, error) {
	return api.New(api.Config{Config: c, Sessions: s.Store})
}

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
