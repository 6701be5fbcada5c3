// Package lambdahttp serves an http.Handler as an AWS Lambda function behind
// an API Gateway HTTP API (payload format 2.0).
//
// Lakeshore keeps its HTTP routing and business rules in one router in
// shared/, and the mains in functions/ stay a few lines long: they build that
// router and hand it to Start. The same router is also served by a plain
// net/http server under `lakeshore dev` and exercised with httptest in tests,
// so this package is the only place that knows about API Gateway events. It
// turns each event into an ordinary *http.Request, records what the handler
// writes, and turns that into the event response, mimicking net/http's server
// closely enough (Host, RequestURI, content sniffing, bodiless statuses) that
// a handler cannot tell the difference.
//
// Every answer the handler gives, 4xx and 5xx included, is a normal response,
// never a Lambda error: a Lambda error would make API Gateway answer a bare
// 500 and hide the handler's JSON error body. Events that cannot become a
// request (an unknown method, a body that is not valid base64) are answered
// with 400 and a JSON error body, and a handler panic is recovered, logged and
// answered with 500, so Handler never returns a non-nil error.
package lambdahttp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"runtime/debug"
	"strings"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"

	"github.com/dreamlake/lakeshore/shared/wire"
)

// Start serves h as the Lambda function's handler; like lambda.Start it
// never returns.
func Start(h http.Handler) {
	lambda.Start(Handler(h))
}

// Handler returns a Lambda handler that answers API Gateway HTTP API
// (payload format 2.0) events with h.
//
// The request carries ctx as its context, the method, path and query of the
// event, its headers (values comma-joined as API Gateway delivers them) with
// the event's cookies as one Cookie header, Host from the host header or else
// the API's domain name, and RemoteAddr set to the caller's source IP (an
// address without a port). The original event is available to h through
// EventFromContext.
//
// The response carries h's status, its headers with multiple values joined by
// ", " (payload 2.0 has no multi-value headers), every Set-Cookie value in
// Cookies, and the body, base64-encoded when it is not valid UTF-8.
//
// The returned error is always nil; see the package documentation.
func Handler(h http.Handler) func(ctx context.Context, req events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
	return func(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (events.APIGatewayV2HTTPResponse, error) {
		r, err := newRequest(ctx, ev)
		if err != nil {
			return errorResponse(wire.Errorf(wire.CodeInvalid, "%s", err.Error())), nil
		}
		w := newResponseWriter(r.Method)
		if p := serve(h, w, r); p != nil {
			slog.Default().ErrorContext(ctx, "lambdahttp: handler panicked",
				"method", r.Method,
				"path", r.URL.Path,
				"request_id", ev.RequestContext.RequestID,
				"panic", fmt.Sprint(p.value),
				"stack", string(p.stack))
			return errorResponse(wire.Errorf(wire.CodeInternal, "internal server error")), nil
		}
		return w.response(), nil
	}
}

type eventKey struct{}

// EventFromContext returns the API Gateway event that a request served by
// Handler was built from, for the few things an http.Request cannot carry
// (authorizer claims, stage, request ID). It reports false outside Lambda,
// such as under a local server or in tests.
func EventFromContext(ctx context.Context) (events.APIGatewayV2HTTPRequest, bool) {
	ev, ok := ctx.Value(eventKey{}).(*events.APIGatewayV2HTTPRequest)
	if !ok {
		return events.APIGatewayV2HTTPRequest{}, false
	}
	return *ev, true
}

// newRequest builds the request net/http's server would have handed to a
// handler for ev.
func newRequest(ctx context.Context, ev events.APIGatewayV2HTTPRequest) (*http.Request, error) {
	method := ev.RequestContext.HTTP.Method
	if method == "" {
		return nil, fmt.Errorf("event has no HTTP method (requestContext.http.method)")
	}

	body := []byte(ev.Body)
	if ev.IsBase64Encoded {
		var err error
		body, err = base64.StdEncoding.DecodeString(ev.Body)
		if err != nil {
			return nil, fmt.Errorf("event body is marked base64 but does not decode: %v", err)
		}
	}

	ctx = context.WithValue(ctx, eventKey{}, &ev)
	// The URL is replaced below: NewRequest would parse it as a client URL,
	// whereas a server request holds only the path and query.
	r, err := http.NewRequestWithContext(ctx, method, "/", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("invalid request: %v", err)
	}
	// As for a server request: the body is never nil, and there is no
	// GetBody, which only a client uses.
	r.GetBody = nil
	if len(body) == 0 {
		r.Body = http.NoBody
	}

	r.URL = requestURL(ev)
	r.RequestURI = r.URL.RequestURI()

	if ev.RequestContext.HTTP.Protocol != "" {
		if major, minor, ok := http.ParseHTTPVersion(ev.RequestContext.HTTP.Protocol); ok {
			r.Proto, r.ProtoMajor, r.ProtoMinor = ev.RequestContext.HTTP.Protocol, major, minor
		}
	}

	for k, v := range ev.Headers {
		// Add, not Set: a raw event may spell one header in two cases.
		r.Header.Add(k, v)
	}
	if len(ev.Cookies) > 0 {
		// Payload 2.0 moves the Cookie header into Cookies.
		r.Header.Set("Cookie", strings.Join(ev.Cookies, "; "))
	}

	// net/http's server moves Host out of the header map.
	r.Host = r.Header.Get("Host")
	r.Header.Del("Host")
	if r.Host == "" {
		r.Host = ev.RequestContext.DomainName
	}
	r.RemoteAddr = ev.RequestContext.HTTP.SourceIP
	return r, nil
}

// requestURL returns the path and query of ev as a server request's URL.
// API Gateway sends rawPath percent-encoded as the client sent it; an escape
// that does not decode is kept literally rather than refused, since the
// router can still answer 404 for it.
func requestURL(ev events.APIGatewayV2HTTPRequest) *url.URL {
	raw := ev.RawPath
	if raw == "" {
		raw = ev.RequestContext.HTTP.Path
	}
	if !strings.HasPrefix(raw, "/") {
		raw = "/" + raw
	}
	u := &url.URL{Path: raw, RawQuery: ev.RawQueryString}
	if p, err := url.PathUnescape(raw); err == nil {
		// RawPath only counts when it is a valid encoding of Path, so a
		// path with nothing escaped round-trips either way.
		u.Path, u.RawPath = p, raw
	}
	return u
}

type panicked struct {
	value any
	stack []byte
}

// serve runs h and reports a panic instead of propagating it, so that one bad
// request cannot take down the Lambda runtime's invoke loop.
func serve(h http.Handler, w http.ResponseWriter, r *http.Request) (p *panicked) {
	defer func() {
		if v := recover(); v != nil {
			p = &panicked{value: v, stack: debug.Stack()}
		}
	}()
	h.ServeHTTP(w, r)
	return nil
}

// errorResponse answers with the wire API's error body for err.
func errorResponse(err *wire.Error) events.APIGatewayV2HTTPResponse {
	b, _ := json.Marshal(wire.BodyFor(err)) // two strings: cannot fail
	return events.APIGatewayV2HTTPResponse{
		StatusCode: wire.Status(err.Code),
		Headers:    map[string]string{"Content-Type": "application/json"},
		Body:       string(b),
	}
}

// responseWriter records a response in memory, with the net/http server
// behaviours a handler may rely on: headers are fixed at WriteHeader, the
// first Write implies 200, bodies are dropped for HEAD and refused for 204
// and 304, and a missing Content-Type is sniffed from the body.
type responseWriter struct {
	method  string
	header  http.Header
	sent    http.Header // header as of WriteHeader
	status  int
	wrote   bool
	body    bytes.Buffer
	discard bool // HEAD: count nothing, keep nothing
}

var (
	_ http.ResponseWriter = (*responseWriter)(nil)
	_ http.Flusher        = (*responseWriter)(nil)
	_ io.StringWriter     = (*responseWriter)(nil)
)

func newResponseWriter(method string) *responseWriter {
	return &responseWriter{method: method, header: make(http.Header), discard: method == http.MethodHead}
}

func (w *responseWriter) Header() http.Header { return w.header }

func (w *responseWriter) WriteHeader(code int) {
	if code < 100 || code > 999 {
		// The same check, and the same panic, as net/http's server.
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if w.wrote {
		return
	}
	if code < 200 {
		// Informational answers cannot be relayed through API Gateway;
		// the final status is still to come.
		return
	}
	w.wrote = true
	w.status = code
	w.sent = w.header.Clone()
}

func (w *responseWriter) Write(p []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if !bodyAllowed(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if w.discard {
		return len(p), nil
	}
	return w.body.Write(p)
}

func (w *responseWriter) WriteString(s string) (int, error) {
	return w.Write([]byte(s))
}

// Flush only fixes the status and headers: the whole body goes back in one
// response anyway, but handlers that stream may type-assert http.Flusher.
func (w *responseWriter) Flush() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
}

func bodyAllowed(status int) bool {
	return status != http.StatusNoContent && status != http.StatusNotModified
}

// response converts what was recorded into the event response.
func (w *responseWriter) response() events.APIGatewayV2HTTPResponse {
	if !w.wrote {
		// A handler that writes nothing answers 200, as under net/http.
		w.WriteHeader(http.StatusOK)
	}
	body := w.body.Bytes()
	res := events.APIGatewayV2HTTPResponse{StatusCode: w.status, Headers: map[string]string{}}
	for k, vs := range w.sent {
		switch {
		case len(vs) == 0 || strings.HasPrefix(k, http.TrailerPrefix):
		case k == "Set-Cookie":
			res.Cookies = append(res.Cookies, vs...)
		default:
			res.Headers[k] = strings.Join(vs, ", ")
		}
	}
	// Setting Content-Type to nil (present, no values) turns sniffing off,
	// as it does under net/http.
	if _, set := w.sent["Content-Type"]; !set && len(body) > 0 && w.sent.Get("Content-Encoding") == "" {
		res.Headers["Content-Type"] = http.DetectContentType(body)
	}
	if utf8.Valid(body) {
		res.Body = string(body)
	} else {
		res.Body = base64.StdEncoding.EncodeToString(body)
		res.IsBase64Encoded = true
	}
	return res
}
