// Command reaper is the scheduled redelivery sweep. It only wires: the
// sweep lives in shared/store, the handler in shared/reaper.
package main

import "github.com/dreamlake/lakeshore/shared/config"

func main() { config.RunReaper() }
