package main

import "github.com/spf13/cobra"

// addClientCommands adds the operator API client commands (submit, get, ls,
// drain, watch).
func addClientCommands(root *cobra.Command) {}
