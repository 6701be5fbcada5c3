package ui

import (
	"bytes"
	"io"
	"net/http"
)

// inProcess sends a client's requests straight to the API's handler in
// this process: the web view is a client of the same routes the CLI uses,
// with the same checks, and no second network hop.
type inProcess struct{ h http.Handler }

func (t inProcess) RoundTrip(req *http.Request) (*http.Response, error) {
	rec := &recorder{header: http.Header{}, status: http.StatusOK}
	t.h.ServeHTTP(rec, req)
	return &http.Response{
		Status: http.StatusText(rec.status), StatusCode: rec.status, Header: rec.header,
		Body: io.NopCloser(&rec.body), ContentLength: int64(rec.body.Len()), Request: req,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
	}, nil
}

// recorder is the http.ResponseWriter inProcess hands the API.
type recorder struct {
	header      http.Header
	status      int
	wroteHeader bool
	body        bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if !r.wroteHeader {
		r.status, r.wroteHeader = status, true
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(p)
}
