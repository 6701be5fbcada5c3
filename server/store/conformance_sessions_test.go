package store_test

import (
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// The web view's session calls run in the conformance suite, on every
// backend.
func init() {
	conformanceCases = append(conformanceCases,
		conformanceCase{"ui session/create, read, touch, end", testUISessionLifecycle},
		conformanceCase{"ui session/an idempotency record is not a session", testUISessionNotARecord},
	)
}

// uiSession is a session opened at t0 for 12 h.
func uiSession(id string) domain.UISession {
	return domain.UISession{ID: id, TokenFingerprint: "fp-" + id, CreatedAt: t0, LastSeenAt: t0, ExpiresAt: t0.Add(12 * time.Hour)}
}

func (f *fixture) uiSession(id string) (domain.UISession, bool) {
	f.t.Helper()
	s, ok, err := f.s.UISession(f.ctx, id)
	if err != nil {
		f.t.Fatalf("UISession %s: %v", id, err)
	}
	return s, ok
}

// testUISessionLifecycle: a session reads back as stored (never a second
// one under its id); a touch moves its activity forward only; an end
// ends it for every later read and touch, and ending it twice is fine.
func testUISessionLifecycle(t *testing.T, f *fixture) {
	const id = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0"
	if _, ok := f.uiSession(id); ok {
		t.Fatal("a session before it was created")
	}
	want := uiSession(id)
	if err := f.s.CreateUISession(f.ctx, want); err != nil {
		t.Fatal(err)
	}
	got, ok := f.uiSession(id)
	if !ok || got != want {
		t.Fatalf("read back %+v %v, want %+v", got, ok, want)
	}
	again := want
	again.TokenFingerprint = "another"
	if err := f.s.CreateUISession(f.ctx, again); err == nil {
		t.Fatal("a second session under one id was stored")
	}
	out, err := f.db.GetItem(f.ctx, &dynamodb.GetItemInput{TableName: aws.String(f.tables.Idempotency),
		Key: map[string]types.AttributeValue{"idempotency_key": &types.AttributeValueMemberS{Value: "uisession#" + id}}})
	if err != nil || out.Item["expires_at"] == nil {
		t.Fatalf("the stored item %v (%v) has no TTL attribute expires_at", out.Item, err)
	}

	later := t0.Add(5 * time.Minute)
	if err := f.s.TouchUISession(f.ctx, id, later); err != nil {
		t.Fatal(err)
	}
	if err := f.s.TouchUISession(f.ctx, id, t0.Add(2*time.Minute)); err != nil {
		t.Fatalf("an older touch: %v, want no error and no write", err)
	}
	if got, _ := f.uiSession(id); !got.LastSeenAt.Equal(later) || got.TokenFingerprint != want.TokenFingerprint || !got.ExpiresAt.Equal(want.ExpiresAt) {
		t.Fatalf("after the touches: %+v, want last seen %s and the rest unchanged", got, later)
	}

	other := "aa" + id[2:]
	if err := f.s.CreateUISession(f.ctx, uiSession(other)); err != nil {
		t.Fatal(err)
	}
	if err := f.s.EndUISession(f.ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.uiSession(id); ok {
		t.Fatal("an ended session reads back")
	}
	if err := f.s.TouchUISession(f.ctx, id, t0.Add(time.Hour)); err != nil {
		t.Fatalf("a touch after the end: %v", err)
	}
	if _, ok := f.uiSession(id); ok {
		t.Fatal("a touch after the end brought the session back")
	}
	if err := f.s.EndUISession(f.ctx, id); err != nil {
		t.Fatalf("ending an ended session: %v", err)
	}
	if _, ok := f.uiSession(other); !ok {
		t.Fatal("ending one session ended another")
	}
}

// testUISessionNotARecord: an operator's submit with an idempotency key
// shaped like a session's makes no session, and ending or touching that
// key leaves the record alone.
func testUISessionNotARecord(t *testing.T, f *fixture) {
	const id = "1111111111111111111111111111111111111111111111111111111111111111"
	req := submitReq("true")
	req.IdempotencyKey = "uisession#" + id
	inv := f.submit(req)
	if _, ok := f.uiSession(id); ok {
		t.Fatal("an idempotency record reads as a session")
	}
	if err := f.s.TouchUISession(f.ctx, id, t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := f.s.EndUISession(f.ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.uiSession(id); ok {
		t.Fatal("an idempotency record reads as a session after a touch")
	}
	if again, created, err := f.svc.Submit(f.ctx, req.Spec()); err != nil || created || again.ID != inv.ID {
		t.Fatalf("the idempotency record went: a replay made %s (created %v, %v), want %s", again.ID, created, err, inv.ID)
	}
}
