package ui

import (
	"net/http"

	"github.com/dreamlake/lakeshore/server/inproc"
)

// inProcess sends a client's requests straight to the API's handler in
// this process: the web view is a client of the same routes the CLI uses,
// with the same checks, and no second network hop.
type inProcess struct{ h http.Handler }

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	return inproc.Serve(t.h, req), nil
}
