// Package inproc hands an HTTP request to a handler in this process and
// returns its answer, as a client transport would after a round trip: for
// a client of a handler the process serves itself (the web view of the API
// routes, `lakeshore dev` of its embedded store), which then costs no
// connection, no system call and no parse of HTTP on either side.
package inproc

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
)

// Serve runs h on req and returns the answer it wrote, whole.
func Serve(h http.Handler, req *http.Request) *http.Response {
	w := &recorder{header: http.Header{}, status: http.StatusOK}
	h.ServeHTTP(w, req)
	return &http.Response{
		Status:     strconv.Itoa(w.status) + " " + http.StatusText(w.status),
		StatusCode: w.status,
		Proto:      "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        w.header,
		Body:          io.NopCloser(&w.body),
		ContentLength: int64(w.body.Len()),
		Request:       req,
	}
}

// recorder is the http.ResponseWriter Serve hands the handler.
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
