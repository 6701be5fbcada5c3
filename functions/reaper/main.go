// Command reaper is the scheduled redelivery sweep. It only wires: the
// sweep lives in server/control, the handler in server/reaper.
package main

import (
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/dreamlake/lakeshore/server/lambdamain"
	"github.com/dreamlake/lakeshore/server/reaper"
)

func main() {
	s := lambdamain.Open("reaper")
	sweep := reaper.Handler(s.Control, s.Control, s.Metrics, s.Store.WorkerRetention, s.Log)
	lambda.Start(reaper.WithBackfill(s.Store, s.Log, sweep))
}
