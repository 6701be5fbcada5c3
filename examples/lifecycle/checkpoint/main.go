// Command checkpoint is a body that works in steps, saves a checkpoint when
// its worker drains, asks to be handed back, and resumes from the
// checkpoint on its next attempt, wherever that runs (docs/lifecycle.md).
//
// Environment: CHECKPOINT_DIR, a directory every attempt reaches (a shared
// volume, or an object store a real body would upload to); STEPS, the steps
// in all (default 100); STEP_MS, the time one step takes (default 50).
//
//	lakeshore submit --queue gpu --env CHECKPOINT_DIR=/mnt/shared/run-42 -- checkpoint
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/dreamlake/lakeshore/shared/lifecycle"
)

// checkpoint is what one attempt leaves for the next.
type checkpoint struct {
	Step    int       `json:"step"`
	Attempt int       `json:"attempt"`
	SavedAt time.Time `json:"saved_at"`
	// DrainSeenAt is when the body heard the drain (how soon it hears it
	// is what the grace window is for).
	DrainSeenAt time.Time `json:"drain_seen_at"`
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "checkpoint:", err)
		os.Exit(1)
	}
}

func run() error {
	dir := os.Getenv("CHECKPOINT_DIR")
	if dir == "" {
		return errors.New("CHECKPOINT_DIR is not set")
	}
	steps, stepTime := envInt("STEPS", 100), time.Duration(envInt("STEP_MS", 50))*time.Millisecond
	path := filepath.Join(dir, "checkpoint.json")
	var ck checkpoint
	switch b, err := os.ReadFile(path); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("read the checkpoint: %w", err)
	default:
		if err := json.Unmarshal(b, &ck); err != nil {
			return fmt.Errorf("read the checkpoint: %w", err)
		}
	}
	resumedFrom := ck.Step
	fmt.Printf("attempt %s: phase %s, host key %q, starting at step %d of %d\n",
		os.Getenv("NYMPH_ATTEMPT"), lifecycle.Phase(), lifecycle.HostKey(), resumedFrom, steps)

	var mu sync.Mutex
	step, stopped := resumedFrom, false
	lifecycle.OnShutdown(func(ctx context.Context) {
		seen := time.Now()
		mu.Lock()
		stopped = true // no step after the one saved
		at := step
		mu.Unlock()
		attempt, _ := strconv.Atoi(os.Getenv("NYMPH_ATTEMPT"))
		if err := save(path, checkpoint{Step: at, Attempt: attempt, SavedAt: time.Now(), DrainSeenAt: seen}); err != nil {
			fmt.Fprintln(os.Stderr, "draining: the checkpoint was not saved:", err)
			return // no hand-back: nymph ends the body at the deadline, and the next attempt starts over
		}
		fmt.Printf("draining: saved step %d; asking to be handed back\n", at)
		if err := lifecycle.Requeue(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "draining: not handed back:", err)
		}
	})

	for {
		mu.Lock()
		if stopped {
			mu.Unlock()
			select {} // the hook hands the run back; nymph ends it
		}
		if step >= steps {
			mu.Unlock()
			break
		}
		step++
		at := step
		mu.Unlock()
		time.Sleep(stepTime)
		if at%10 == 0 {
			fmt.Printf("step %d\n", at)
		}
	}
	result, err := json.Marshal(map[string]int{"steps": steps, "resumed_from": resumedFrom})
	if err != nil {
		return err
	}
	fmt.Printf("done: %d steps, resumed from step %d\n", steps, resumedFrom)
	return os.WriteFile(os.Getenv("NYMPH_RESULT_FILE"), result, 0o600)
}

// save writes ck to path whole or not at all (a rename), so a body killed
// mid-write leaves the previous checkpoint.
func save(path string, ck checkpoint) error {
	b, err := json.Marshal(ck)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}
