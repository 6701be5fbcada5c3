package lambdahttp

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"
)

// MaxEventBody is the largest request body Gateway forwards: Lambda's
// 6 MB invocation payload limit, less room for the rest of the event.
const MaxEventBody = 6<<20 - 64<<10

// ErrBodyTooLarge is returned by Event for a body over MaxEventBody; API
// Gateway answers such a request 413 without invoking the function.
var ErrBodyTooLarge = fmt.Errorf("request body is over %d bytes", MaxEventBody)

// Event builds the event an API Gateway HTTP API (payload format 2.0) sends
// a Lambda integration for r, matched to routeKey ("POST /v1/daemon/hello")
// with pathParams. It is the other half of Handler: `lakeshore dev
// --lambdas` uses it to drive real bootstraps the way API Gateway does.
//
// Header names are lower-cased and repeated values comma-joined; cookies
// move into Cookies; a body that is not valid UTF-8 is base64-encoded.
func Event(r *http.Request, routeKey string, pathParams map[string]string, now time.Time) (events.APIGatewayV2HTTPRequest, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxEventBody+1))
	if err != nil {
		return events.APIGatewayV2HTTPRequest{}, fmt.Errorf("read request body: %w", err)
	}
	if len(body) > MaxEventBody {
		return events.APIGatewayV2HTTPRequest{}, ErrBodyTooLarge
	}
	ev := events.APIGatewayV2HTTPRequest{
		Version:        "2.0",
		RouteKey:       routeKey,
		RawPath:        r.URL.EscapedPath(),
		RawQueryString: r.URL.RawQuery,
		Headers:        map[string]string{},
		PathParameters: pathParams,
	}
	for k, vs := range r.Header {
		k = strings.ToLower(k)
		if k == "cookie" {
			for _, v := range vs {
				for c := range strings.SplitSeq(v, ";") {
					if c = strings.TrimSpace(c); c != "" {
						ev.Cookies = append(ev.Cookies, c)
					}
				}
			}
			continue
		}
		ev.Headers[k] = strings.Join(vs, ",")
	}
	ev.Headers["host"] = r.Host
	if q := r.URL.Query(); len(q) > 0 {
		ev.QueryStringParameters = map[string]string{}
		for k, vs := range q {
			ev.QueryStringParameters[k] = strings.Join(vs, ",")
		}
	}
	if len(body) > 0 {
		if utf8.Valid(body) {
			ev.Body = string(body)
		} else {
			ev.Body, ev.IsBase64Encoded = base64.StdEncoding.EncodeToString(body), true
		}
	}
	source := r.RemoteAddr
	if host, _, err := net.SplitHostPort(source); err == nil {
		source = host
	}
	rc := &ev.RequestContext
	rc.AccountID, rc.APIID, rc.Stage = "000000000000", "local", "$default"
	rc.DomainName, rc.DomainPrefix = r.Host, "local"
	rc.RouteKey, rc.RequestID = routeKey, requestID()
	rc.Time, rc.TimeEpoch = now.UTC().Format("02/Jan/2006:15:04:05 -0700"), now.UnixMilli()
	rc.HTTP = events.APIGatewayV2HTTPRequestContextHTTPDescription{
		Method: r.Method, Path: r.URL.Path, Protocol: r.Proto, SourceIP: source, UserAgent: r.UserAgent(),
	}
	return ev, nil
}

// WriteResponse writes a payload 2.0 response the way API Gateway does:
// status (200 when the function left it zero), headers, each cookie as a
// Set-Cookie header, and the body, base64-decoded when so marked.
func WriteResponse(w http.ResponseWriter, resp events.APIGatewayV2HTTPResponse) error {
	body := []byte(resp.Body)
	if resp.IsBase64Encoded {
		var err error
		if body, err = base64.StdEncoding.DecodeString(resp.Body); err != nil {
			return fmt.Errorf("function answer: body marked base64 does not decode: %w", err)
		}
	}
	h := w.Header()
	for k, v := range resp.Headers {
		h.Set(k, v)
	}
	for k, vs := range resp.MultiValueHeaders {
		for _, v := range vs {
			h.Add(k, v)
		}
	}
	for _, c := range resp.Cookies {
		h.Add("Set-Cookie", c)
	}
	status := resp.StatusCode
	if status == 0 {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	if len(body) == 0 {
		return nil // a 204 or 304 may not have one at all
	}
	_, err := w.Write(body)
	return err
}

// requestID returns an id shaped like API Gateway's request ids.
func requestID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on Linux
	return hex.EncodeToString(b[:])
}
