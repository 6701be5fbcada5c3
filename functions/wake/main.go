// Command wake is the Lambda behind the wake channel's WebSocket API
// ($connect, $disconnect, the keep-alive). It only wires: the routes live in
// server/wake/wakelambda, the use cases in server/control.
package main

import (
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/dreamlake/lakeshore/server/lambdamain"
	"github.com/dreamlake/lakeshore/server/wake/wakelambda"
)

func main() {
	s := lambdamain.Open("wake")
	lambda.Start(wakelambda.Handler(s.Control, s.Config.DaemonAuth, s.Log))
}
