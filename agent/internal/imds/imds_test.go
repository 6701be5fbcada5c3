package imds

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

func TestResolve(t *testing.T) {
	for _, c := range []struct {
		name, configured string
		env              map[string]string
		want             string
		src              Source
	}{
		{"nothing said", "", nil, DefaultEndpoint, Default},
		{"environment", "", map[string]string{EnvEndpoint: "http://127.0.0.1:1"}, "http://127.0.0.1:1", FromEnv},
		{"disabled", "", map[string]string{EnvDisabled: " TRUE ", EnvEndpoint: "http://127.0.0.1:1"}, "", None},
		{"configured wins over disabled", "http://127.0.0.1:2", map[string]string{EnvDisabled: "true"}, "http://127.0.0.1:2", Configured},
		{"configured wins over the environment", "http://127.0.0.1:2", map[string]string{EnvEndpoint: "http://127.0.0.1:1"}, "http://127.0.0.1:2", Configured},
		{"disabled=false is not disabled", "", map[string]string{EnvDisabled: "false"}, DefaultEndpoint, Default},
	} {
		got, src := Resolve(c.configured, func(k string) string { return c.env[k] })
		if got != c.want || src != c.src {
			t.Errorf("%s: Resolve = %q %v, want %q %v", c.name, got, src, c.want, c.src)
		}
	}
}

// TestGet against a fake IMDSv2: a value, a 404 (nothing there, no error),
// a 401 once (the token is dropped and Get asks again with a fresh one),
// and never IMDSv1 (a GET without a token is refused, not answered).
func TestGet(t *testing.T) {
	var puts, refused atomic.Int32
	var revoke atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /latest/api/token", func(w http.ResponseWriter, r *http.Request) {
		n := puts.Add(1)
		w.Header().Set("X-aws-ec2-metadata-token-ttl-seconds", r.Header.Get("X-aws-ec2-metadata-token-ttl-seconds"))
		w.Write([]byte("tok-" + strconv.Itoa(int(n))))
	})
	mux.HandleFunc("GET /latest/meta-data/", func(w http.ResponseWriter, r *http.Request) {
		tok := r.Header.Get("X-aws-ec2-metadata-token")
		if tok == "" || (revoke.Load() && tok == "tok-1") {
			refused.Add(1)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		if r.URL.Path == "/latest/meta-data/instance-id" {
			w.Write([]byte("i-0123456789abcdef0"))
			return
		}
		http.NotFound(w, r)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := New(srv.URL, Options{})

	b, ok, err := Get(ctx, c, "instance-id", 64)
	if err != nil || !ok || string(b) != "i-0123456789abcdef0" {
		t.Fatalf("instance-id: %q %v %v", b, ok, err)
	}
	if _, ok, err := Get(ctx, c, "spot/instance-action", 64); err != nil || ok {
		t.Fatalf("a path with nothing there: ok %v, %v; want not ok, no error", ok, err)
	}
	revoke.Store(true) // IMDS restarted: the first token is no longer good
	if b, ok, err := Get(ctx, c, "instance-id", 64); err != nil || !ok || string(b) != "i-0123456789abcdef0" {
		t.Fatalf("after the token was refused: %q %v %v", b, ok, err)
	}
	if puts.Load() != 2 || refused.Load() != 1 {
		t.Fatalf("%d token PUTs, %d GETs refused; want one token, refused once, then a second", puts.Load(), refused.Load())
	}
	if got := Status(nil); got != 0 {
		t.Fatalf("Status(nil) = %d", got)
	}
}
