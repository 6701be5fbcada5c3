package domain

import "time"

// SetupCommand is one entry of a worker's setup FIFO, kept after it runs as
// its history.
type SetupCommand struct {
	WorkerID   string    `dynamodbav:"worker_id"`
	CommandID  string    `dynamodbav:"command_id"`
	Argv       []string  `dynamodbav:"argv"`
	Status     string    `dynamodbav:"status"`
	ExitCode   *int      `dynamodbav:"exit_code,omitempty"`
	DurationMS int64     `dynamodbav:"duration_ms,omitempty"`
	OutputTail string    `dynamodbav:"output_tail,omitempty"`
	CreatedAt  time.Time `dynamodbav:"created_at"`
	FinishedAt time.Time `dynamodbav:"finished_at,omitempty"`
}
