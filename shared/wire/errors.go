package wire

import (
	"errors"
	"fmt"
	"slices"

	"github.com/dreamlake/lakeshore/shared/domain"
)

// Code is the machine-readable half of an error answer. Each code maps to one
// HTTP status; the mapping lives in exactly one place, Status.
type Code string

// The error codes of the wire API (docs/design.md §3).
const (
	CodeInvalid      Code = "invalid"       // 400: malformed body or a field out of range
	CodeUnauthorized Code = "unauthorized"  // 401: missing or wrong token
	CodeForbidden    Code = "forbidden"     // 403: a token acting for another worker
	CodeNotFound     Code = "not_found"     // 404: unknown id
	CodeConflict     Code = "conflict"      // 409: the state forbids the change
	CodeWorkerGone   Code = "worker_gone"   // 410: the worker is gone; hello again
	CodeTooLarge     Code = "too_large"     // 413: body over MaxBodyBytes
	CodeInternal     Code = "internal"      // 500: a bug or an unexpected store failure
	CodeUnavailable  Code = "unavailable"   // 503: the store did not answer
	CodeNotAllowed   Code = "not_allowed"   // 405: wrong method for the route
	CodeNoRoute      Code = "no_such_route" // 404: no such route
	// CodeNotImplemented: 501, a feature this control plane is not
	// configured for (artifacts without a blob store).
	CodeNotImplemented Code = "not_implemented"
)

// statuses is the one code ⇄ status table: the server answers Status(code),
// and a client that gets a status without a wire error body (an API Gateway
// or proxy answer) reads it back with CodeForStatus. Where codes share a
// status, the first listed is the one read back.
var statuses = []struct {
	code   Code
	status int
}{
	{CodeInvalid, 400},
	{CodeUnauthorized, 401},
	{CodeForbidden, 403},
	{CodeNotFound, 404},
	{CodeNoRoute, 404},
	{CodeNotAllowed, 405},
	{CodeConflict, 409},
	{CodeWorkerGone, 410},
	{CodeTooLarge, 413},
	{CodeInternal, 500},
	{CodeNotImplemented, 501},
	{CodeUnavailable, 503},
}

// gatewayUnavailable are statuses only a gateway or proxy in front of the
// control plane answers (throttled, no upstream, upstream timed out): to a
// client they mean what 503 means, try again.
var gatewayUnavailable = []int{429, 502, 504}

// Status reports the HTTP status for code. Unknown codes are 500.
func Status(code Code) int {
	for _, e := range statuses {
		if e.code == code {
			return e.status
		}
	}
	return 500
}

// CodeForStatus reports the code of an answer with status that came without
// a wire error body: the inverse of Status, read from the same table.
// Unknown statuses are CodeInternal.
func CodeForStatus(status int) Code {
	for _, e := range statuses {
		if e.status == status {
			return e.code
		}
	}
	if slices.Contains(gatewayUnavailable, status) {
		return CodeUnavailable
	}
	return CodeInternal
}

// Error is an error with a wire code. Handlers return it; the transport turns
// it into {"error": {"code", "message"}} with Status(Code).
type Error struct {
	Code    Code
	Message string
	// Reason, when set, says more than the code, for a client to act on
	// (ReasonReplaced).
	Reason string
	Err    error // optional cause, never sent over the wire
}

// ReasonReplaced, on a worker_gone answer, says the worker was retired
// because a hello from another boot of its machine replaced it: while this
// process still runs, another one uses the same machine id.
const ReasonReplaced = "replaced"

// Errorf returns an *Error with a formatted message.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

func (e *Error) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Code, e.Message, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is a sentinel of the same code (ErrNotFound…),
// or a domain sentinel of the kind the code maps to, so sentinel errors
// match any error of that code.
func (e *Error) Is(target error) bool {
	switch t := target.(type) {
	case *Error:
		return t.Message == "" && t.Code == e.Code
	case domain.Sentinel:
		k, sentinel := t.SentinelKind()
		return sentinel && codeOfKind(k) == e.Code
	}
	return false
}

// SentinelKind reports the domain kind of e's code, and whether e is a
// sentinel: a domain error matches it in errors.Is.
func (e *Error) SentinelKind() (domain.Kind, bool) { return kindOfCode(e.Code), e.Message == "" }

// kinds is the one domain kind ⇄ wire code table: what the use cases and
// the store report, and the code the API answers it with.
var kinds = []struct {
	kind domain.Kind
	code Code
}{
	{domain.KindInvalid, CodeInvalid},
	{domain.KindConflict, CodeConflict},
	{domain.KindForbidden, CodeForbidden},
	{domain.KindGone, CodeWorkerGone},
	{domain.KindNotFound, CodeNotFound},
	{domain.KindUnauthorized, CodeUnauthorized},
	{domain.KindUnavailable, CodeUnavailable},
	{domain.KindInternal, CodeInternal},
}

func codeOfKind(k domain.Kind) Code {
	for _, e := range kinds {
		if e.kind == k {
			return e.code
		}
	}
	return CodeInternal
}

func kindOfCode(c Code) domain.Kind {
	for _, e := range kinds {
		if e.code == c {
			return e.kind
		}
	}
	return 0
}

// Sentinels for errors.Is: each matches every *Error of its code.
var (
	ErrInvalid      = &Error{Code: CodeInvalid}
	ErrUnauthorized = &Error{Code: CodeUnauthorized}
	ErrForbidden    = &Error{Code: CodeForbidden}
	ErrNotFound     = &Error{Code: CodeNotFound}
	ErrConflict     = &Error{Code: CodeConflict}
	ErrWorkerGone   = &Error{Code: CodeWorkerGone}
)

// CodeOf reports the wire code carried by err (a wire error's, or a domain
// error's kind's), or CodeInternal.
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	var de *domain.Error
	if errors.As(err, &de) {
		return codeOfKind(de.Kind)
	}
	return CodeInternal
}

// ErrorBody is the JSON shape of every error answer.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the inside of ErrorBody.
type ErrorDetail struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
	Reason  string `json:"reason,omitempty"`
}

// BodyFor reports the wire body for err. Internal errors get a generic
// message: their text may hold store details an operator should read in logs.
func BodyFor(err error) ErrorBody {
	var e *Error
	if errors.As(err, &e) && e.Code != CodeInternal {
		return ErrorBody{Error: ErrorDetail{Code: e.Code, Message: e.Message, Reason: e.Reason}}
	}
	var de *domain.Error
	if errors.As(err, &de) && codeOfKind(de.Kind) != CodeInternal {
		return ErrorBody{Error: ErrorDetail{Code: codeOfKind(de.Kind), Message: de.Message, Reason: de.Reason}}
	}
	return ErrorBody{Error: ErrorDetail{Code: CodeInternal, Message: "internal error; see the control plane log"}}
}
