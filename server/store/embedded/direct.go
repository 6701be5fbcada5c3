package embedded

import (
	"fmt"
	"net/http"

	"github.com/dreamlake/lakeshore/server/inproc"
)

// Direct is an HTTP client (the SDK's HTTPClient) that hands each request
// to Handler in this process and returns its answer (inproc.Serve): for the
// process that embeds the store (`lakeshore dev`), whose own requests then
// cost no connection, no system call and no parse of HTTP on either side.
// The SDK still encodes, signs and decodes every request as it does for
// DynamoDB, and the handler is the one other processes reach over the
// endpoint.
type Direct struct {
	Handler http.Handler
}

// Do serves req. A request whose context has ended is not served.
func (d Direct) Do(req *http.Request) (*http.Response, error) {
	if err := req.Context().Err(); err != nil {
		return nil, fmt.Errorf("embedded store: %w", err)
	}
	resp := inproc.Serve(d.Handler, req)
	if req.Body != nil {
		_ = req.Body.Close()
	}
	return resp, nil
}
