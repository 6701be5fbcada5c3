// Command poll is the Lambda behind the poll route group. It only wires: the
// routes and rules live in shared/, so the same code runs under Lambda,
// under `lakeshore dev` and in tests.
package main

import "github.com/dreamlake/lakeshore/server/api/apilambda"

func main() { apilambda.Main("poll", apilambda.Daemon) }
