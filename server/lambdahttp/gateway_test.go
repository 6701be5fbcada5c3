package lambdahttp_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/dreamlake/lakeshore/server/lambdahttp"
)

// echo answers with what it saw of the request, sets a cookie and a
// repeated header, and answers 204 on DELETE.
func echo(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	http.SetCookie(w, &http.Cookie{Name: "a", Value: "1"})
	w.Header().Add("X-Many", "1")
	w.Header().Add("X-Many", "2")
	if r.Method == http.MethodDelete {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	w.WriteHeader(http.StatusTeapot)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"method": r.Method, "path": r.URL.Path, "query": r.URL.Query(), "auth": r.Header.Get("Authorization"),
		"cookie": r.Header.Get("Cookie"), "body": body, "host": r.Host,
	})
}

// TestGatewayRoundTrip: a request turned into an event by Event, served by
// Handler and written back by WriteResponse reads as if served directly.
func TestGatewayRoundTrip(t *testing.T) {
	for _, tc := range []struct{ name, method, target, body string }{
		{"json body", "POST", "/v1/daemon/hello", `{"machine_id":"m"}`},
		{"query and escaped path", "GET", "/v1/invocations/inv%2F1?queue=q&limit=2&limit=3", ""},
		{"binary body", "POST", "/v1/x", "\xff\xfe\x00"},
		{"no content", "DELETE", "/v1/x", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			newReq := func() *http.Request {
				r := httptest.NewRequest(tc.method, tc.target, strings.NewReader(tc.body))
				r.Header.Set("Authorization", "Bearer tok")
				r.Header.Add("Cookie", "c=1; d=2")
				return r
			}
			direct := httptest.NewRecorder()
			echo(direct, newReq())

			ev, err := lambdahttp.Event(newReq(), tc.method+" /v1/x", nil, time.Unix(0, 0))
			if err != nil {
				t.Fatal(err)
			}
			if ev.Headers["authorization"] != "Bearer tok" || len(ev.Cookies) != 2 || ev.RequestContext.HTTP.SourceIP != "192.0.2.1" {
				t.Fatalf("event: headers %v cookies %v source %q", ev.Headers, ev.Cookies, ev.RequestContext.HTTP.SourceIP)
			}
			resp, err := lambdahttp.Handler(http.HandlerFunc(echo))(context.Background(), ev)
			if err != nil {
				t.Fatal(err)
			}
			viaGateway := httptest.NewRecorder()
			if err := lambdahttp.WriteResponse(viaGateway, resp); err != nil {
				t.Fatal(err)
			}
			if viaGateway.Code != direct.Code || viaGateway.Body.String() != direct.Body.String() {
				t.Fatalf("through the gateway: %d %q\ndirect: %d %q", viaGateway.Code, viaGateway.Body, direct.Code, direct.Body)
			}
			for _, h := range []string{"Set-Cookie"} {
				if got, want := viaGateway.Result().Header.Get(h), direct.Result().Header.Get(h); got != want {
					t.Errorf("%s: %q, direct %q", h, got, want)
				}
			}
			if got := viaGateway.Header().Values("X-Many"); strings.Join(got, ",") != "1, 2" && strings.Join(got, ",") != "1,2" {
				t.Errorf("X-Many: %q (payload 2.0 joins repeated headers)", got)
			}
		})
	}
}

// TestGatewayBodyLimit: a body over Lambda's payload limit is refused
// before any function runs.
func TestGatewayBodyLimit(t *testing.T) {
	r := httptest.NewRequest("POST", "/v1/x", strings.NewReader(strings.Repeat("x", lambdahttp.MaxEventBody+1)))
	if _, err := lambdahttp.Event(r, "POST /v1/x", nil, time.Now()); err != lambdahttp.ErrBodyTooLarge {
		t.Fatalf("oversized body: %v", err)
	}
}
