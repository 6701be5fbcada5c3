package embedded

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// Direct is an HTTP client (the SDK's HTTPClient) that hands each request
// to Handler in this process and returns its answer: for the process that
// embeds the store (`lakeshore dev`), whose own requests then cost no
// connection, no system call and no parse of HTTP on either side. The SDK
// still encodes, signs and decodes every request as it does for DynamoDB,
// and the handler is the one other processes reach over the endpoint.
type Direct struct {
	Handler http.Handler
}

// Do serves req. A request whose context has ended is not served.
func (d Direct) Do(req *http.Request) (*http.Response, error) {
	if err := req.Context().Err(); err != nil {
		return nil, fmt.Errorf("embedded store: %w", err)
	}
	w := &answer{header: http.Header{}, code: http.StatusOK}
	d.Handler.ServeHTTP(w, req)
	if req.Body != nil {
		_ = req.Body.Close()
	}
	body := w.body.Bytes()
	w.header.Set("Content-Length", strconv.Itoa(len(body)))
	return &http.Response{
		Status:     strconv.Itoa(w.code) + " " + http.StatusText(w.code),
		StatusCode: w.code,
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        w.header,
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}, nil
}

// answer is the http.ResponseWriter Direct gives the handler.
type answer struct {
	header http.Header
	code   int
	wrote  bool
	body   bytes.Buffer
}

func (a *answer) Header() http.Header { return a.header }

func (a *answer) WriteHeader(code int) {
	if !a.wrote {
		a.code, a.wrote = code, true
	}
}

func (a *answer) Write(p []byte) (int, error) {
	a.wrote = true
	return a.body.Write(p)
}
