package domain

import "time"

// SetupCommand is one entry of a worker's setup FIFO, kept after it runs as
// its history.
type SetupCommand struct {
	WorkerID   string
	CommandID  string
	Argv       []string
	Status     string
	ExitCode   *int
	DurationMS int64
	OutputTail string
	CreatedAt  time.Time
	FinishedAt time.Time
}
