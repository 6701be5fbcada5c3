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

	"github.com/dreamlake/lakeshore/shared/api"
	"github.com/dreamlake/lakeshore/shared/store"
	"github.com/dreamlake/lakeshore/shared/store/schema"
	"github.com/dreamlake/lakeshore/shared/store/storetest"
)

// Tokens every Plane uses.
const (
	EnrollToken   = "test-enroll-token"
	OperatorToken = "test-operator-token"
)

// Plane is a running control plane.
type Plane struct {
	URL    string
	Store  *store.Store
	DB     *dynamodb.Client
	Prefix string
	// Handler is the router itself, for tests that put their own front in
	// place of the loopback server (an API Gateway stand-in, say).
	Handler http.Handler
}

// New starts a control plane for the length of the test. Options adjust the
// router's configuration before it is built (clock, stale window, logger).
func New(t testing.TB, opts ...func(*api.Config)) *Plane {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	db := storetest.Embedded(t)
	prefix := storetest.Prefix(t)
	if err := schema.EnsureTables(ctx, db, prefix); err != nil {
		t.Fatalf("apitest: create tables: %v", err)
	}
	st := store.New(db, prefix)
	cfg := api.Config{
		Store:         st,
		EnrollToken:   EnrollToken,
		OperatorToken: OperatorToken,
		Logger:        slog.New(slog.DiscardHandler),
	}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := api.New(cfg)
	if err != nil {
		t.Fatalf("apitest: api.New: %v", err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	return &Plane{URL: hs.URL, Store: st, DB: db, Prefix: prefix, Handler: srv}
}
