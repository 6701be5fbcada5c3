// Command bye is the Lambda behind the bye route group. It only wires: the
// routes and rules live in shared/, so the same code runs under Lambda,
// under `lakeshore dev` and in tests.
package main

import "github.com/dreamlake/lakeshore/server/api/apilambda"

func main() { apilambda.Main("bye", apilambda.Daemon) }
