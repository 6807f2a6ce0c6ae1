// Package errdefs defines the small, closed set of error classes forkbox uses
// everywhere. Packages wrap one of these sentinels with %w ("create sandbox:
// %w"); the HTTP edge (package api) maps the class to a status code and an
// RFC 9457 problem type exactly once, and the Go client maps it back so that
// errors.Is works across the wire.
package errdefs

import (
	"errors"
	"fmt"
	"time"
)

// The error classes. Each is a sentinel to be wrapped, never returned bare
// when more context is available.
var (
	// ErrInvalidArgument: the caller sent something malformed or out of range (HTTP 400).
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrUnauthenticated: no or wrong credentials (HTTP 401).
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied: credentials are fine but the action is not allowed (HTTP 403).
	ErrPermissionDenied = errors.New("permission denied")
	// ErrNotFound: the named resource does not exist or is not visible (HTTP 404).
	ErrNotFound = errors.New("not found")
	// ErrConflict: the resource exists or is in a state that forbids the action (HTTP 409).
	ErrConflict = errors.New("conflict")
	// ErrTerminated: the session has ended; the reason is in the message (HTTP 410).
	ErrTerminated = errors.New("session terminated")
	// ErrResourceExhausted: a quota or limit was hit (HTTP 429).
	ErrResourceExhausted = errors.New("resource exhausted")
	// ErrInsufficientStorage: the sandbox's disk is full (HTTP 507).
	ErrInsufficientStorage = errors.New("insufficient storage")
	// ErrUnavailable: the host or a dependency cannot serve the request now (HTTP 503).
	ErrUnavailable = errors.New("unavailable")
	// ErrInternal: a bug or an unexpected host failure (HTTP 500).
	ErrInternal = errors.New("internal error")
)

// FieldError is an ErrInvalidArgument that names the offending request field,
// so the HTTP edge can report it ("memory_mb: must be between 64 and 65536").
type FieldError struct {
	// Field is the request field's JSON name, dotted for nested fields
	// ("env.PATH", "limits.cpu").
	Field string
	// Reason says what is wrong, lower case, no trailing period.
	Reason string
}

// Error returns "Field: Reason".
func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Unwrap makes errors.Is(err, ErrInvalidArgument) true.
func (e *FieldError) Unwrap() error { return ErrInvalidArgument }

// InvalidField returns a *FieldError for field with a formatted reason.
func InvalidField(field, format string, args ...any) error {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Field returns the field named by the first *FieldError in err's chain, or "".
func Field(err error) string {
	var fe *FieldError
	if errors.As(err, &fe) {
		return fe.Field
	}
	return ""
}

// Class returns the class sentinel err wraps, or ErrInternal when it wraps none.
func Class(err error) error {
	for _, c := range []error{ErrInvalidArgument, ErrUnauthenticated, ErrPermissionDenied,
		ErrNotFound, ErrConflict, ErrTerminated, ErrResourceExhausted, ErrInsufficientStorage, ErrUnavailable} {
		if errors.Is(err, c) {
			return c
		}
	}
	return ErrInternal
}

// Newf returns an error of class with a formatted message: Newf(ErrNotFound,
// "session %q", id) reads `session "x": not found`.
func Newf(class error, format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), class)
}

// TypedError is an error of a class with a problem type more precise than
// the class's own: the system design's policy errors (image-not-approved,
// egress-not-allowed, tenant-concurrency-exceeded, capacity-unavailable).
// The HTTP edge reports Type as the problem type and RetryAfter as the
// Retry-After header.
type TypedError struct {
	// Class is one of the class sentinels above.
	Class error
	// Type is the problem type's slug ("image-not-approved").
	Type string
	// Msg is the detail, lower case.
	Msg string
	// Field names the request field at fault, if any.
	Field string
	// RetryAfter, when positive, is when a retry may succeed.
	RetryAfter time.Duration
}

// Error returns the detail.
func (e *TypedError) Error() string { return e.Msg }

// Unwrap makes errors.Is(err, e.Class) true.
func (e *TypedError) Unwrap() error { return e.Class }

// Typed returns a *TypedError of class with problem type typ and a
// formatted detail.
func Typed(class error, typ string, format string, args ...any) *TypedError {
	return &TypedError{Class: class, Type: typ, Msg: fmt.Sprintf(format, args...)}
}
