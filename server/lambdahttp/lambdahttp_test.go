package lambdahttp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/dreamlake/lakeshore/shared/syncbuf"
)

// seen is what echoHandler reports about the request it was given.
type seen struct {
	Method        string      `json:"method"`
	Path          string      `json:"path"`
	EscapedPath   string      `json:"escaped_path"`
	RawQuery      string      `json:"raw_query"`
	RequestURI    string      `json:"request_uri"`
	Host          string      `json:"host"`
	RemoteAddr    string      `json:"remote_addr"`
	Proto         string      `json:"proto"`
	Header        http.Header `json:"header"`
	Body          []byte      `json:"body"` // base64 in JSON, so binary survives
	ContentLength int64       `json:"content_length"`
}

// echoHandler answers with a JSON description of the request it saw.
var echoHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(seen{
		Method:        r.Method,
		Path:          r.URL.Path,
		EscapedPath:   r.URL.EscapedPath(),
		RawQuery:      r.URL.RawQuery,
		RequestURI:    r.RequestURI,
		Host:          r.Host,
		RemoteAddr:    r.RemoteAddr,
		Proto:         r.Proto,
		Header:        r.Header,
		Body:          body,
		ContentLength: r.ContentLength,
	})
})

// event returns a minimal valid event for method and rawPath.
func event(method, rawPath string) events.APIGatewayV2HTTPRequest {
	return events.APIGatewayV2HTTPRequest{
		Version: "2.0",
		RawPath: rawPath,
		Headers: map[string]string{},
		RequestContext: events.APIGatewayV2HTTPRequestContext{
			DomainName: "abc123.execute-api.eu-west-1.amazonaws.com",
			RequestID:  "req-1",
			HTTP: events.APIGatewayV2HTTPRequestContextHTTPDescription{
				Method:   method,
				Path:     rawPath,
				Protocol: "HTTP/1.1",
				SourceIP: "203.0.113.7",
			},
		},
	}
}

// echo serves ev with echoHandler and decodes what it saw.
func echo(t *testing.T, ev events.APIGatewayV2HTTPRequest) seen {
	t.Helper()
	res, err := Handler(echoHandler)(context.Background(), ev)
	if err != nil {
		t.Fatalf("Handler returned error %v", err)
	}
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status = %d, body %q", res.StatusCode, res.Body)
	}
	var s seen
	if err := json.Unmarshal([]byte(res.Body), &s); err != nil {
		t.Fatalf("decoding echo %q: %v", res.Body, err)
	}
	return s
}

func TestRequestRoundTrip(t *testing.T) {
	binary := []byte{0x00, 0xff, 0xfe, 'h', 'i', 0x80}
	tests := []struct {
		name  string
		event func() events.APIGatewayV2HTTPRequest
		check func(t *testing.T, s seen)
	}{
		{
			name: "method path query and source ip",
			event: func() events.APIGatewayV2HTTPRequest {
				ev := event(http.MethodGet, "/v1/invocations/inv_01")
				ev.RawQueryString = "queue=gpu&limit=10&q=two%20words"
				return ev
			},
			check: func(t *testing.T, s seen) {
				want := seen{
					Method:      http.MethodGet,
					Path:        "/v1/invocations/inv_01",
					EscapedPath: "/v1/invocations/inv_01",
					RawQuery:    "queue=gpu&limit=10&q=two%20words",
					RequestURI:  "/v1/invocations/inv_01?queue=gpu&limit=10&q=two%20words",
					Host:        "abc123.execute-api.eu-west-1.amazonaws.com",
					RemoteAddr:  "203.0.113.7",
					Proto:       "HTTP/1.1",
					Header:      http.Header{},
					Body:        []byte{},
				}
				if !reflect.DeepEqual(s, want) {
					t.Errorf("saw\n%+v\nwant\n%+v", s, want)
				}
			},
		},
		{
			name: "post body and headers",
			event: func() events.APIGatewayV2HTTPRequest {
				ev := event(http.MethodPost, "/v1/daemon/hello")
				ev.Headers = map[string]string{
					"content-type":  "application/json",
					"authorization": "Bearer tok",
					"accept":        "text/plain, application/json",
					"host":          "api.lakeshore.example",
				}
				ev.Body = `{"machine_id":"m1"}`
				return ev
			},
			check: func(t *testing.T, s seen) {
				if s.Method != http.MethodPost || string(s.Body) != `{"machine_id":"m1"}` || s.ContentLength != 19 {
					t.Errorf("method %q body %q content length %d", s.Method, s.Body, s.ContentLength)
				}
				wantHeader := http.Header{
					"Content-Type":  {"application/json"},
					"Authorization": {"Bearer tok"},
					// Kept comma-joined, as API Gateway delivers it.
					"Accept": {"text/plain, application/json"},
				}
				if !reflect.DeepEqual(s.Header, wantHeader) {
					t.Errorf("header = %v, want %v (Host moved to r.Host)", s.Header, wantHeader)
				}
				if s.Host != "api.lakeshore.example" {
					t.Errorf("host = %q, want the host header", s.Host)
				}
			},
		},
		{
			name: "cookies become one cookie header",
			event: func() events.APIGatewayV2HTTPRequest {
				ev := event(http.MethodGet, "/")
				ev.Cookies = []string{"a=1", "b=two"}
				return ev
			},
			check: func(t *testing.T, s seen) {
				if got := s.Header.Values("Cookie"); !reflect.DeepEqual(got, []string{"a=1; b=two"}) {
					t.Errorf("Cookie = %q", got)
				}
			},
		},
		{
			name: "path falls back to request context",
			event: func() events.APIGatewayV2HTTPRequest {
				ev := event(http.MethodGet, "")
				ev.RequestContext.HTTP.Path = "/readyz"
				return ev
			},
			check: func(t *testing.T, s seen) {
				if s.Path != "/readyz" || s.RequestURI != "/readyz" {
					t.Errorf("path %q request URI %q", s.Path, s.RequestURI)
				}
			},
		},
		{
			name:  "no path at all is root",
			event: func() events.APIGatewayV2HTTPRequest { return event(http.MethodGet, "") },
			check: func(t *testing.T, s seen) {
				if s.Path != "/" {
					t.Errorf("path = %q, want /", s.Path)
				}
			},
		},
		{
			name:  "escaped path keeps its encoding",
			event: func() events.APIGatewayV2HTTPRequest { return event(http.MethodGet, "/v1/files/a%2Fb%20c") },
			check: func(t *testing.T, s seen) {
				if s.Path != "/v1/files/a/b c" || s.EscapedPath != "/v1/files/a%2Fb%20c" {
					t.Errorf("path %q escaped %q", s.Path, s.EscapedPath)
				}
			},
		},
		{
			name:  "undecodable escape is kept literally",
			event: func() events.APIGatewayV2HTTPRequest { return event(http.MethodGet, "/a%zz") },
			check: func(t *testing.T, s seen) {
				if s.Path != "/a%zz" {
					t.Errorf("path = %q", s.Path)
				}
			},
		},
		{
			name: "host falls back to domain name",
			event: func() events.APIGatewayV2HTTPRequest {
				ev := event(http.MethodGet, "/")
				ev.RequestContext.DomainName = "api.example.com"
				return ev
			},
			check: func(t *testing.T, s seen) {
				if s.Host != "api.example.com" {
					t.Errorf("host = %q", s.Host)
				}
			},
		},
		{
			name: "base64 body is decoded",
			event: func() events.APIGatewayV2HTTPRequest {
				ev := event(http.MethodPut, "/blob")
				ev.Body = base64.StdEncoding.EncodeToString(binary)
				ev.IsBase64Encoded = true
				return ev
			},
			check: func(t *testing.T, s seen) {
				if !bytes.Equal(s.Body, binary) || s.ContentLength != int64(len(binary)) {
					t.Errorf("body %x (length %d), want %x", s.Body, s.ContentLength, binary)
				}
			},
		},
		{
			name: "protocol is carried",
			event: func() events.APIGatewayV2HTTPRequest {
				ev := event(http.MethodGet, "/")
				ev.RequestContext.HTTP.Protocol = "HTTP/2.0"
				return ev
			},
			check: func(t *testing.T, s seen) {
				if s.Proto != "HTTP/2.0" {
					t.Errorf("proto = %q", s.Proto)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.check(t, echo(t, tt.event()))
		})
	}
}

// TestDocumentedEvent serves the example event of the API Gateway developer
// guide ("Working with AWS Lambda proxy integrations for HTTP APIs"),
// decoded from JSON as the Lambda runtime does.
func TestDocumentedEvent(t *testing.T) {
	const raw = `{
	  "version": "2.0",
	  "routeKey": "$default",
	  "rawPath": "/my/path",
	  "rawQueryString": "parameter1=value1&parameter1=value2&parameter2=value",
	  "cookies": ["cookie1", "cookie2"],
	  "headers": {"header1": "value1", "header2": "value1,value2"},
	  "queryStringParameters": {"parameter1": "value1,value2", "parameter2": "value"},
	  "requestContext": {
	    "accountId": "123456789012",
	    "apiId": "api-id",
	    "domainName": "id.execute-api.us-east-1.amazonaws.com",
	    "domainPrefix": "id",
	    "http": {
	      "method": "POST",
	      "path": "/my/path",
	      "protocol": "HTTP/1.1",
	      "sourceIp": "192.0.2.1",
	      "userAgent": "agent"
	    },
	    "requestId": "id",
	    "routeKey": "$default",
	    "stage": "$default",
	    "time": "12/Mar/2020:19:03:58 +0000",
	    "timeEpoch": 1583348638390
	  },
	  "body": "Hello from Lambda",
	  "pathParameters": {"parameter1": "value1"},
	  "isBase64Encoded": false,
	  "stageVariables": {"stageVariable1": "value1"}
	}`
	var ev events.APIGatewayV2HTTPRequest
	if err := json.Unmarshal([]byte(raw), &ev); err != nil {
		t.Fatal(err)
	}
	s := echo(t, ev)
	want := seen{
		Method:      http.MethodPost,
		Path:        "/my/path",
		EscapedPath: "/my/path",
		RawQuery:    "parameter1=value1&parameter1=value2&parameter2=value",
		RequestURI:  "/my/path?parameter1=value1&parameter1=value2&parameter2=value",
		Host:        "id.execute-api.us-east-1.amazonaws.com",
		RemoteAddr:  "192.0.2.1",
		Proto:       "HTTP/1.1",
		Header: http.Header{
			"Header1": {"value1"},
			"Header2": {"value1,value2"},
			"Cookie":  {"cookie1; cookie2"},
		},
		Body:          []byte("Hello from Lambda"),
		ContentLength: 17,
	}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("saw\n%+v\nwant\n%+v", s, want)
	}
}

func TestResponse(t *testing.T) {
	binary := []byte{0x89, 'P', 'N', 'G', 0x00, 0xff, 0xfe}
	tests := []struct {
		name        string
		method      string // GET when empty
		handler     http.HandlerFunc
		wantStatus  int
		wantHeaders map[string]string // a subset of the response headers
		noHeaders   []string
		wantCookies []string
		wantBody    string
		wantBase64  bool
	}{
		{
			name:        "writing nothing is 200",
			handler:     func(w http.ResponseWriter, r *http.Request) {},
			wantStatus:  http.StatusOK,
			noHeaders:   []string{"Content-Type"},
			wantCookies: nil,
			wantBody:    "",
		},
		{
			name: "first write implies 200 and sniffs the type",
			handler: func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.WriteString(w, "hello")
			},
			wantStatus:  http.StatusOK,
			wantHeaders: map[string]string{"Content-Type": "text/plain; charset=utf-8"},
			wantBody:    "hello",
		},
		{
			name: "explicit status and json",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, `{"id":"inv_1"}`)
			},
			wantStatus:  http.StatusCreated,
			wantHeaders: map[string]string{"Content-Type": "application/json"},
			wantBody:    `{"id":"inv_1"}`,
		},
		{
			name: "404 is a response",
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.NotFound(w, r)
			},
			wantStatus: http.StatusNotFound,
			wantBody:   "404 page not found\n",
		},
		{
			name: "409 json error is a response",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusConflict)
				_, _ = io.WriteString(w, `{"error":{"code":"conflict","message":"already acked"}}`)
			},
			wantStatus: http.StatusConflict,
			wantBody:   `{"error":{"code":"conflict","message":"already acked"}}`,
		},
		{
			name: "500 is a response not an error",
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, "boom", http.StatusInternalServerError)
			},
			wantStatus: http.StatusInternalServerError,
			wantBody:   "boom\n",
		},
		{
			name: "503 with retry-after",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Retry-After", "5")
				w.WriteHeader(http.StatusServiceUnavailable)
			},
			wantStatus:  http.StatusServiceUnavailable,
			wantHeaders: map[string]string{"Retry-After": "5"},
		},
		{
			name: "informational status is not final",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusEarlyHints)
				w.WriteHeader(http.StatusAccepted)
			},
			wantStatus: http.StatusAccepted,
		},
		{
			name: "multiple header values are joined",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Add("Vary", "Accept")
				w.Header().Add("Vary", "Authorization")
				w.Header().Set("X-Single", "one")
			},
			wantStatus:  http.StatusOK,
			wantHeaders: map[string]string{"Vary": "Accept, Authorization", "X-Single": "one"},
		},
		{
			name: "set-cookie goes to cookies",
			handler: func(w http.ResponseWriter, r *http.Request) {
				http.SetCookie(w, &http.Cookie{Name: "session", Value: "abc", Path: "/", HttpOnly: true})
				http.SetCookie(w, &http.Cookie{Name: "theme", Value: "dark"})
				w.WriteHeader(http.StatusNoContent)
			},
			wantStatus:  http.StatusNoContent,
			noHeaders:   []string{"Set-Cookie"},
			wantCookies: []string{"session=abc; Path=/; HttpOnly", "theme=dark"},
		},
		{
			name: "headers changed after WriteHeader are not sent",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-Before", "yes")
				w.WriteHeader(http.StatusAccepted)
				w.Header().Set("X-After", "yes")
				http.SetCookie(w, &http.Cookie{Name: "late", Value: "1"})
			},
			wantStatus:  http.StatusAccepted,
			wantHeaders: map[string]string{"X-Before": "yes"},
			noHeaders:   []string{"X-After"},
			wantCookies: nil,
		},
		{
			name: "binary body is base64",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/octet-stream")
				_, _ = w.Write(binary)
			},
			wantStatus:  http.StatusOK,
			wantHeaders: map[string]string{"Content-Type": "application/octet-stream"},
			wantBody:    base64.StdEncoding.EncodeToString(binary),
			wantBase64:  true,
		},
		{
			name: "utf-8 text stays text",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				_, _ = io.WriteString(w, "héllo ✓")
			},
			wantStatus: http.StatusOK,
			wantBody:   "héllo ✓",
		},
		{
			name: "nil content-type turns sniffing off",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header()["Content-Type"] = nil
				_, _ = io.WriteString(w, "<html></html>")
			},
			wantStatus: http.StatusOK,
			noHeaders:  []string{"Content-Type"},
			wantBody:   "<html></html>",
		},
		{
			name: "204 refuses a body",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusNoContent)
				if _, err := io.WriteString(w, "ignored"); err != http.ErrBodyNotAllowed {
					panic("write after 204 returned " + errString(err))
				}
			},
			wantStatus: http.StatusNoContent,
			noHeaders:  []string{"Content-Type"},
		},
		{
			name:   "head drops the body",
			method: http.MethodHead,
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/json")
				if n, err := io.WriteString(w, `{"ok":true}`); n != 11 || err != nil {
					panic("write on HEAD returned " + errString(err))
				}
			},
			wantStatus:  http.StatusOK,
			wantHeaders: map[string]string{"Content-Type": "application/json"},
		},
		{
			name: "flush fixes the status",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.(http.Flusher).Flush()
				w.WriteHeader(http.StatusTeapot)
				_, _ = io.WriteString(w, "streamed")
			},
			wantStatus: http.StatusOK,
			wantBody:   "streamed",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			method := tt.method
			if method == "" {
				method = http.MethodGet
			}
			res, err := Handler(tt.handler)(context.Background(), event(method, "/"))
			if err != nil {
				t.Fatalf("Handler returned error %v", err)
			}
			if res.StatusCode != tt.wantStatus {
				t.Errorf("status = %d, want %d", res.StatusCode, tt.wantStatus)
			}
			for k, v := range tt.wantHeaders {
				if got, ok := res.Headers[k]; !ok || got != v {
					t.Errorf("header %s = %q (present %v), want %q; all %v", k, got, ok, v, res.Headers)
				}
			}
			for _, k := range tt.noHeaders {
				if v, ok := res.Headers[k]; ok {
					t.Errorf("header %s = %q, want absent", k, v)
				}
			}
			if !reflect.DeepEqual(res.Cookies, tt.wantCookies) {
				t.Errorf("cookies = %q, want %q", res.Cookies, tt.wantCookies)
			}
			if res.Body != tt.wantBody || res.IsBase64Encoded != tt.wantBase64 {
				t.Errorf("body = %q (base64 %v), want %q (base64 %v)", res.Body, res.IsBase64Encoded, tt.wantBody, tt.wantBase64)
			}
			if res.MultiValueHeaders != nil {
				t.Errorf("MultiValueHeaders = %v; payload 2.0 ignores them", res.MultiValueHeaders)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}

// errorBody is the wire API's error shape.
type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// checkJSONError fails t unless res is a JSON error answer with status and
// code.
func checkJSONError(t *testing.T, res events.APIGatewayV2HTTPResponse, status int, code string) errorBody {
	t.Helper()
	if res.StatusCode != status {
		t.Errorf("status = %d, want %d", res.StatusCode, status)
	}
	if ct := res.Headers["Content-Type"]; ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	if res.IsBase64Encoded || len(res.Cookies) != 0 {
		t.Errorf("base64 %v cookies %q, want neither", res.IsBase64Encoded, res.Cookies)
	}
	var body errorBody
	dec := json.NewDecoder(strings.NewReader(res.Body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		t.Fatalf("body %q is not a JSON error: %v", res.Body, err)
	}
	if body.Error.Code != code || body.Error.Message == "" {
		t.Errorf("error = %+v, want code %q and a message", body.Error, code)
	}
	return body
}

func TestMalformedEventIsBadRequest(t *testing.T) {
	tests := []struct {
		name        string
		event       func() events.APIGatewayV2HTTPRequest
		wantMessage string // a substring of the message
	}{
		{
			name: "invalid base64 body",
			event: func() events.APIGatewayV2HTTPRequest {
				ev := event(http.MethodPost, "/v1/daemon/ack")
				ev.Body = "not base64!"
				ev.IsBase64Encoded = true
				return ev
			},
			wantMessage: "base64",
		},
		{
			name:        "no method",
			event:       func() events.APIGatewayV2HTTPRequest { return event("", "/") },
			wantMessage: "method",
		},
		{
			name:        "method that is not a token",
			event:       func() events.APIGatewayV2HTTPRequest { return event("GET /x", "/") },
			wantMessage: "method",
		},
		{
			name:        "empty event",
			event:       func() events.APIGatewayV2HTTPRequest { return events.APIGatewayV2HTTPRequest{} },
			wantMessage: "method",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			called := false
			h := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true })
			res, err := Handler(h)(context.Background(), tt.event())
			if err != nil {
				t.Fatalf("Handler returned error %v, want a 400 response", err)
			}
			body := checkJSONError(t, res, http.StatusBadRequest, "invalid")
			if !strings.Contains(body.Error.Message, tt.wantMessage) {
				t.Errorf("message %q does not mention %q", body.Error.Message, tt.wantMessage)
			}
			if called {
				t.Error("handler was called for a malformed event")
			}
		})
	}
}

// captureLog sends slog's default logger to a buffer for the test.
func captureLog(t *testing.T) *syncbuf.Buffer {
	t.Helper()
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	var buf syncbuf.Buffer
	slog.SetDefault(slog.New(slog.NewJSONHandler(&buf, nil)))
	return &buf
}

func TestPanicIsInternalError(t *testing.T) {
	tests := []struct {
		name      string
		handler   http.HandlerFunc
		wantPanic string // in the log
	}{
		{
			name:      "panic before writing",
			handler:   func(http.ResponseWriter, *http.Request) { panic("nil map") },
			wantPanic: "nil map",
		},
		{
			name: "panic after a partial response",
			handler: func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/csv")
				w.Header().Set("X-Partial", "yes")
				http.SetCookie(w, &http.Cookie{Name: "session", Value: "abc"})
				w.WriteHeader(http.StatusOK)
				_, _ = io.WriteString(w, "a,b\n")
				panic("half way")
			},
			wantPanic: "half way",
		},
		{
			name:      "abort handler",
			handler:   func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) },
			wantPanic: "net/http: abort Handler",
		},
		{
			name:      "invalid status code",
			handler:   func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(42) },
			wantPanic: "invalid WriteHeader code 42",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			logs := captureLog(t)
			res, err := Handler(tt.handler)(context.Background(), event(http.MethodPost, "/v1/daemon/poll"))
			if err != nil {
				t.Fatalf("Handler returned error %v, want a 500 response", err)
			}
			checkJSONError(t, res, http.StatusInternalServerError, "internal")
			if _, ok := res.Headers["X-Partial"]; ok {
				t.Errorf("partial response header leaked: %v", res.Headers)
			}
			var entry map[string]any
			if err := json.Unmarshal([]byte(logs.String()), &entry); err != nil {
				t.Fatalf("log %q is not one JSON entry: %v", logs.String(), err)
			}
			if entry["level"] != "ERROR" || entry["panic"] != tt.wantPanic ||
				entry["path"] != "/v1/daemon/poll" || entry["request_id"] != "req-1" ||
				!strings.Contains(entry["stack"].(string), "lambdahttp") {
				t.Errorf("log entry = %v", entry)
			}
		})
	}
}

type ctxKey struct{}

func TestContext(t *testing.T) {
	tests := []struct {
		name  string
		check func(t *testing.T, r *http.Request)
	}{
		{
			name: "values of the invocation context reach the handler",
			check: func(t *testing.T, r *http.Request) {
				if got := r.Context().Value(ctxKey{}); got != "invocation" {
					t.Errorf("context value = %v", got)
				}
			},
		},
		{
			name: "cancellation reaches the handler",
			check: func(t *testing.T, r *http.Request) {
				if r.Context().Err() != context.Canceled {
					t.Errorf("context err = %v, want canceled", r.Context().Err())
				}
			},
		},
		{
			name: "event is available",
			check: func(t *testing.T, r *http.Request) {
				ev, ok := EventFromContext(r.Context())
				if !ok || ev.RequestContext.RequestID != "req-1" || ev.RawPath != "/ctx" {
					t.Errorf("EventFromContext = %+v, %v", ev.RequestContext, ok)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "invocation"))
			cancel()
			ran := false
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ran = true
				tt.check(t, r)
			})
			if _, err := Handler(h)(ctx, event(http.MethodGet, "/ctx")); err != nil {
				t.Fatal(err)
			}
			if !ran {
				t.Fatal("handler did not run")
			}
		})
	}
	if _, ok := EventFromContext(context.Background()); ok {
		t.Error("EventFromContext reports an event outside Lambda")
	}
}

// TestResponseJSON checks the response as the Lambda runtime will send it to
// API Gateway.
func TestResponseJSON(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		http.SetCookie(w, &http.Cookie{Name: "a", Value: "1"})
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	res, err := Handler(h)(context.Background(), event(http.MethodPost, "/"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"statusCode":        float64(http.StatusAccepted),
		"headers":           map[string]any{"Content-Type": "application/json"},
		"multiValueHeaders": nil,
		"body":              `{"ok":true}`,
		"cookies":           []any{"a=1"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("response JSON = %s", b)
	}
}
