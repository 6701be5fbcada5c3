// Package apitest serves the real control-plane router over a fresh
// embedded store on a loopback port, for tests of anything that talks to the
// API (the client, the CLI, the agent).
package apitest

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/dreamlake/lakeshore/server/api"
	"github.com/dreamlake/lakeshore/server/api/daemonapi"
	"github.com/dreamlake/lakeshore/server/control"
	"github.com/dreamlake/lakeshore/server/store"
	"github.com/dreamlake/lakeshore/server/store/schema"
	"github.com/dreamlake/lakeshore/server/store/storetest"
)

// Tokens every Plane uses.
const (
	EnrollToken   = "test-enroll-token"
	OperatorToken = "test-operator-token"
)

// Plane is a running control plane.
type Plane struct {
	URL string
	// Store is the router's store: through Options.Transport when one is set.
	Store *store.Store
	// DB reaches the same tables without faults, whatever Options say.
	DB     *dynamodb.Client
	Prefix string
	// Truth is a store over DB: what a test reads the outcome from when the
	// router's store goes through faults (Store itself without them).
	Truth *store.Store
	// Endpoint is the embedded DynamoDB's URL.
	Endpoint string
	// Handler is the router itself, for tests that put their own front in
	// place of the loopback server (an API Gateway stand-in, say).
	Handler http.Handler
}

// Config is what a plane is built from, as a main builds it: the store,
// the use cases over it (one Service) and the router over those.
type Config struct {
	api.Config
	// Control is the use cases' configuration; its Store is Store.
	Control control.Config
	// Store is the store the use cases and the web view's sessions use.
	Store *store.Store
}

// Build wires cfg as a main does: one Service over cfg.Store, and the
// router over it (its logger the router's when Control has none).
func Build(cfg Config) (*api.Server, error) {
	cfg.Control.Store = cfg.Store
	if cfg.Control.Logger == nil {
		cfg.Control.Logger = cfg.Logger
	}
	cfg.Config.Control = control.New(cfg.Control)
	cfg.Config.Sessions = cfg.Store
	return api.New(cfg.Config)
}

// New starts a control plane for the length of the test. Options adjust the
// configuration before it is built (clock, stale window, logger).
func New(t testing.TB, opts ...func(*Config)) *Plane {
	t.Helper()
	return NewWith(t, Options{}, opts...)
}

// Options choose how NewWith reaches the store.
type Options struct {
	// Transport, when set, carries every request of the router's store
	// (storetest.FaultyClient), so the control plane meets the faults it
	// injects and retries as the SDK does. Tables are created, and
	// Plane.DB and Plane.Truth read, without it.
	Transport *storetest.FaultyTransport
	// ClientTimeout bounds each HTTP attempt of that store client (zero:
	// none); a Delay fault needs it shorter than Transport.Hold.
	ClientTimeout time.Duration
}

// NewWith is New with the store reached as o says.
func NewWith(t testing.TB, o Options, opts ...func(*Config)) *Plane {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	endpoint := storetest.EmbeddedEndpoint(t)
	db := storetest.Client(endpoint)
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(ctx, db, prefix); err != nil {
		t.Fatalf("apitest: create tables: %v", err)
	}
	truth := store.New(db, prefix)
	st := truth
	if o.Transport != nil {
		st = store.New(storetest.FaultyClient(endpoint, o.Transport, o.ClientTimeout), prefix)
	}
	cfg := Config{Store: st, Config: api.Config{Config: daemonapi.Config{
		EnrollToken:   EnrollToken,
		OperatorToken: OperatorToken,
		Logger:        slog.New(slog.DiscardHandler),
	}}}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := Build(cfg)
	if err != nil {
		t.Fatalf("apitest: api.New: %v", err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &Plane{URL: hs.URL, Store: st, DB: db, Prefix: prefix, Truth: truth, Endpoint: endpoint, Handler: srv}
}
