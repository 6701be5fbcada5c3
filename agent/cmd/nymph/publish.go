package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/dreamlake/lakeshore/agent"
	"github.com/dreamlake/lakeshore/shared/lifecycle"
)

// runPublish is `nymph publish PATH [--name NAME]`, run inside a body: it
// asks the nymph running the body, at NYMPH_LIFECYCLE_URL, to publish PATH
// (a relative one is taken from this command's working directory) as an
// artifact of the body's attempt, and prints what was recorded. It exits
// 0 once recorded, 1 when refused or failed, 2 on a usage error.
func runPublish(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("nymph publish", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: nymph publish PATH [--name NAME]  (inside a body: publish a file or directory of the run as an artifact)")
		fs.PrintDefaults()
	}
	name := fs.String("name", "", "the artifact's name (default: PATH's base name)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return agent.ExitOK
		}
		return agent.ExitUsage
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return agent.ExitUsage
	}
	// Interrupted, the upload stops; no deadline otherwise, as a large
	// artifact takes as long as its upload (nymph bounds each request).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	a, err := lifecycle.Publish(ctx, fs.Arg(0), *name)
	if err != nil {
		fmt.Fprintln(stderr, "nymph publish:", err)
		return agent.ExitFailure
	}
	fmt.Fprintf(stdout, "published %s: %d bytes, sha256 %s (attempt %d)\n", a.Name, a.Size, a.SHA256, a.Attempt)
	return agent.ExitOK
}
