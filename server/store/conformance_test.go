package store_test

import (
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/dreamlake/lakeshore/server/store/storetest"
)

// backend is one DynamoDB engine the conformance suite runs on, with what
// it is known to do differently from DynamoDB (docs/design.md §2). The quirk fields
// are asserted, so an emulator release that changes them fails the suite
// and the store's workarounds can be reconsidered.
type backend struct {
	name   string
	client func(testing.TB) *dynamodb.Client
	// removeKeepsAttribute: a top-level REMOVE in an UpdateExpression is
	// ignored, so a sparse index keeps the item (minidyn v0.8.2).
	removeKeepsAttribute bool
	// mangleEmptyCollections: an empty M or L attribute does not read back
	// as written (minidyn v0.8.2); DynamoDB and moto keep it.
	mangleEmptyCollections bool
}

// backends are the engines every conformance case runs on. The moto here
// is the shared, threaded moto_server: the cases are sequential, so its
// lack of locking does not matter (race_test.go uses a single-threaded one).
var backends = []backend{
	{name: "embedded", client: storetest.Embedded, removeKeepsAttribute: true, mangleEmptyCollections: true},
	{name: "moto", client: storetest.Moto},
}

// conformanceCase is one behaviour of the store, run on every backend.
type conformanceCase struct {
	name string
	run  func(t *testing.T, f *fixture)
}

// TestConformance runs every case on every backend, each case on tables of
// its own (a fresh prefix).
func TestConformance(t *testing.T) { runCases(t, conformanceCases) }

// runCases runs cases on every backend, each case on tables of its own.
func runCases(t *testing.T, cases []conformanceCase) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			db := b.client(t)
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					c.run(t, newFixture(t, b, db))
				})
			}
		})
	}
}

// conformanceCases are the cases TestConformance runs. Each topic's file
// (conformance_<topic>_test.go) adds its own in an init, beside the cases
// themselves; the fixture they share is in conformance_fixture_test.go.
var conformanceCases []conformanceCase
