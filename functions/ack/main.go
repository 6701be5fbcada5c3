// Command ack is the Lambda behind the ack route group (the acks, shipped
// output, and the daemon's artifact presign and complete). It only wires:
// the routes and rules live in shared/, so the same code runs under
// Lambda, under `lakeshore dev` and in tests.
package main

import (
	"github.com/dreamlake/lakeshore/server/api/apilambda"
	"github.com/dreamlake/lakeshore/server/blobs/blobslambda"
)

func main() { apilambda.Main("ack", blobslambda.Hook) }
