// Command fn is a Lambda function for the rie package's tests: it echoes
// its event, sleeps for {"sleep_ms": N}, waits for {"wait_file": path} to
// exist, then fails for {"fail": "why"} or exits for {"exit": true}.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"time"

	"github.com/aws/aws-lambda-go/lambda"
)

type event struct {
	SleepMS  int    `json:"sleep_ms"`
	Fail     string `json:"fail"`
	Exit     bool   `json:"exit"`
	WaitFile string `json:"wait_file"`
}

func main() {
	lambda.Start(func(ctx context.Context, raw json.RawMessage) (map[string]any, error) {
		var ev event
		if err := json.Unmarshal(raw, &ev); err != nil {
			return nil, err
		}
		time.Sleep(time.Duration(ev.SleepMS) * time.Millisecond)
		for ev.WaitFile != "" && ctx.Err() == nil {
			if _, err := os.Stat(ev.WaitFile); err == nil {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if ev.Exit {
			os.Exit(3)
		}
		if ev.Fail != "" {
			return nil, errors.New(ev.Fail)
		}
		return map[string]any{"pid": os.Getpid(), "event": raw, "env": os.Getenv("RIE_TEST_VALUE")}, nil
	})
}
