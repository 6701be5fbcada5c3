package wire

import (
	"errors"
	"fmt"
	"testing"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// TestDomainErrorsAnswerWithTheirCode: what the store and the use cases
// report (domain errors of a kind) is answered with its kind's code and
// message, never its cause, and matches both the wire and the domain
// sentinels of that kind, wrapped or not.
func TestDomainErrorsAnswerWithTheirCode(t *testing.T) {
	for _, c := range []struct {
		kind     domain.Kind
		code     Code
		sentinel error
	}{
		{domain.KindInvalid, CodeInvalid, ErrInvalid},
		{domain.KindConflict, CodeConflict, ErrConflict},
		{domain.KindForbidden, CodeForbidden, ErrForbidden},
		{domain.KindGone, CodeWorkerGone, ErrWorkerGone},
		{domain.KindNotFound, CodeNotFound, ErrNotFound},
		{domain.KindUnauthorized, CodeUnauthorized, ErrUnauthorized},
		{domain.KindUnavailable, CodeUnavailable, nil},
	} {
		err := fmt.Errorf("op: %w", &domain.Error{Kind: c.kind, Message: "what happened", Err: errors.New("the secret cause")})
		if got := CodeOf(err); got != c.code {
			t.Errorf("kind %d: code %s, want %s", c.kind, got, c.code)
		}
		if b := BodyFor(err); b.Error.Code != c.code || b.Error.Message != "what happened" {
			t.Errorf("kind %d: body %+v, want code %s and the message alone", c.kind, b, c.code)
		}
		if c.sentinel != nil && !errors.Is(err, c.sentinel) {
			t.Errorf("kind %d: does not match the wire sentinel %v", c.kind, c.sentinel)
		}
		if we := Errorf(c.code, "from the wire"); !errors.Is(we, &domain.Error{Kind: c.kind}) {
			t.Errorf("code %s: a wire error does not match the domain sentinel of kind %d", c.code, c.kind)
		}
	}
	if errors.Is(&domain.Error{Kind: domain.KindConflict, Message: "x"}, ErrNotFound) {
		t.Error("a conflict matches not_found")
	}
	if errors.Is(&domain.Error{Kind: domain.KindConflict, Message: "x"}, Errorf(CodeConflict, "not a sentinel")) {
		t.Error("an error with a message matched as a sentinel")
	}
	if b := BodyFor(&domain.Error{Kind: domain.KindInternal, Message: "internals"}); b.Error.Code != CodeInternal || b.Error.Message == "internals" {
		t.Errorf("an internal error's body %+v tells its message", b)
	}
}
