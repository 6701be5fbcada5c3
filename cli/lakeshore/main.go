// Command lakeshore is the operator CLI: `lakeshore dev` runs the whole
// control plane locally; the other commands are thin clients of the
// operator API.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCmd().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "lakeshore:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "lakeshore",
		Short:         "Lakeshore: a serverless control plane for fleets of workers that run queued work",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version,
	}
	root.SetVersionTemplate("lakeshore {{.Version}}\n")
	root.AddCommand(newDevCmd())
	root.AddCommand(newTablesCmd())
	root.AddCommand(newTemplateCmd())
	addClientCommands(root)
	root.AddCommand(newArtifactsCmd())
	return root
}
