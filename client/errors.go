package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/errdefs"
)

// Error is an API error: the problem details the daemon returned.
type Error struct {
	v1.Problem
}

// Error returns "detail (HTTP status)"; a not-found problem whose detail
// only names the thing (`session "x"`) reads `session "x" not found`.
func (e *Error) Error() string {
	if e.Status == http.StatusNotFound && e.Type != "about:blank" {
		return e.detail()
	}
	return fmt.Sprintf("%s (HTTP %d)", e.detail(), e.Status)
}

// detail is the problem's detail (its title when it has none), with "not
// found" added to a not-found problem's detail that does not say so.
func (e *Error) detail() string {
	msg := e.Detail
	if msg == "" {
		msg = e.Title
	}
	if e.Status == http.StatusNotFound && e.Type != "about:blank" && !saysMissing(msg) {
		msg += " not found"
	}
	return msg
}

// saysMissing reports whether msg says already that something is not
// there.
func saysMissing(msg string) bool {
	l := strings.ToLower(msg)
	return strings.Contains(l, "not found") || strings.Contains(l, "does not exist") || strings.Contains(l, "no such")
}

// Unwrap returns the errdefs class matching the problem type; a type
// more precise than its class (tenant-quota-exceeded, agent-failed, ...)
// or an answer that is no problem document is classed by its HTTP status.
func (e *Error) Unwrap() error {
	switch strings.TrimPrefix(e.Type, "/problems/") {
	case "invalid-argument":
		return errdefs.ErrInvalidArgument
	case "unauthenticated":
		return errdefs.ErrUnauthenticated
	case "permission-denied":
		return errdefs.ErrPermissionDenied
	case "not-found":
		return errdefs.ErrNotFound
	case "conflict":
		return errdefs.ErrConflict
	case "session-terminated":
		return errdefs.ErrTerminated
	case "resource-exhausted":
		return errdefs.ErrResourceExhausted
	case "insufficient-storage":
		return errdefs.ErrInsufficientStorage
	case "unavailable", "registry-unreachable", "registry-error":
		return errdefs.ErrUnavailable
	case "template-too-large":
		return errdefs.ErrResourceExhausted
	}
	return classOfStatus(e.Status)
}

// classOfStatus is the errdefs class of an HTTP status, as the daemon maps
// them (api/problem.go): 413 and 415 are invalid arguments.
func classOfStatus(status int) error {
	switch status {
	case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
		return errdefs.ErrInvalidArgument
	case http.StatusUnauthorized:
		return errdefs.ErrUnauthenticated
	case http.StatusForbidden:
		return errdefs.ErrPermissionDenied
	case http.StatusNotFound:
		return errdefs.ErrNotFound
	case http.StatusConflict:
		return errdefs.ErrConflict
	case http.StatusGone:
		return errdefs.ErrTerminated
	case http.StatusTooManyRequests:
		return errdefs.ErrResourceExhausted
	case http.StatusInsufficientStorage:
		return errdefs.ErrInsufficientStorage
	case http.StatusServiceUnavailable:
		return errdefs.ErrUnavailable
	}
	return errdefs.ErrInternal
}

func decodeError(resp *http.Response) error {
	e := &Error{Problem: v1.Problem{Status: resp.StatusCode}}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err := json.Unmarshal(b, e); err != nil || e.Type == "" {
		e.Type = "about:blank"
		e.Title = resp.Status
		e.Detail = strings.TrimSpace(string(b))
	}
	if e.Status == 0 {
		e.Status = resp.StatusCode
	}
	return e
}

// UnreachableError is the error of a call whose connection to the daemon
// could not be made (refused, no route, a name that does not resolve):
// no daemon answered, so nothing was done. It unwraps to the transport's
// error and is of class errdefs.ErrUnavailable.
type UnreachableError struct {
	// URL is the daemon's base URL the client was made for.
	URL string
	// Err is the dial error.
	Err error
}

// Error returns "cannot reach the forkbox daemon at URL: is `forkbox
// serve` running? (the dial error)".
func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach the forkbox daemon at %s: is `forkbox serve` running? (%v)", e.URL, dialCause(e.Err))
}

// Unwrap returns the dial error and errdefs.ErrUnavailable.
func (e *UnreachableError) Unwrap() []error { return []error{e.Err, errdefs.ErrUnavailable} }

// dialCause is the end of a dial error's chain worth showing: "connect:
// connection refused" rather than the whole "Get URL: dial tcp ADDR:
// ..." sentence, which repeats the URL.
func dialCause(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}

// unreachable returns err of sending a request to the daemon at base as an
// *UnreachableError when it is a failure to connect, and err as it is
// otherwise (a canceled context, a connection cut during the call).
func unreachable(base string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return &UnreachableError{URL: base, Err: err}
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return &UnreachableError{URL: base, Err: err}
	}
	return err
}

// KeyError is the error of a call the daemon refused because of the API
// key (401: unknown, revoked or missing): it says where the client read
// the key from, so the user knows which setting to fix. It unwraps to the
// daemon's *Error (class errdefs.ErrUnauthenticated).
type KeyError struct {
	// Source says where the key came from ("FORKBOX_API_KEY", "the
	// --api-key flag", "the key file /var/lib/forkbox/api-key"); ""
	// when the client was given the key by its program (New).
	Source string
	// Err is the daemon's answer.
	Err *Error
}

// Error returns "the API key was refused (401): ... (the key was read
// from SOURCE; the daemon said: DETAIL)".
func (e *KeyError) Error() string {
	from := ""
	if e.Source != "" {
		from = "the key was read from " + e.Source + "; "
	}
	return fmt.Sprintf("the API key was refused (401): set %s or --api-key to a key of this daemon "+
		"(forkbox key create makes one; the daemon's first key is in its data directory's api-key file) (%sthe daemon said: %s)",
		EnvAPIKey, from, e.Err.detail())
}

// Unwrap returns the daemon's answer.
func (e *KeyError) Unwrap() error { return e.Err }
