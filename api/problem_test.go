package api

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
)

// TestProblemForEveryClass proves each errdefs class maps to its status,
// "/problems/<slug>" type and title, with the message (minus the class
// suffix) as detail, through any wrapping.
func TestProblemForEveryClass(t *testing.T) {
	cases := []struct {
		class  error
		status int
		slug   string
	}{
		{errdefs.ErrInvalidArgument, http.StatusBadRequest, "invalid-argument"},
		{errdefs.ErrUnauthenticated, http.StatusUnauthorized, "unauthenticated"},
		{errdefs.ErrPermissionDenied, http.StatusForbidden, "permission-denied"},
		{errdefs.ErrNotFound, http.StatusNotFound, "not-found"},
		{errdefs.ErrConflict, http.StatusConflict, "conflict"},
		{errdefs.ErrTerminated, http.StatusGone, "session-terminated"},
		{errdefs.ErrResourceExhausted, http.StatusTooManyRequests, "resource-exhausted"},
		{errdefs.ErrInsufficientStorage, http.StatusInsufficientStorage, "insufficient-storage"},
		{errdefs.ErrUnavailable, http.StatusServiceUnavailable, "unavailable"},
	}
	if len(cases)+1 != len(problemClasses) {
		t.Fatalf("%d classes tested, %d in the table: add the new class here", len(cases)+1, len(problemClasses))
	}
	for _, c := range cases {
		for _, err := range []error{
			errdefs.Newf(c.class, "thing %q", "x"),
			fmt.Errorf("outer: %w", errdefs.Newf(c.class, "thing %q", "x")),
		} {
			p := ProblemFor(err)
			if p.Status != c.status || p.Type != "/problems/"+c.slug || p.Title == "" || p.Field != "" {
				t.Errorf("%v: problem %+v, want status %d type /problems/%s", err, p, c.status, c.slug)
			}
			if !strings.HasSuffix(p.Detail, `thing "x"`) || strings.Contains(p.Detail, c.class.Error()) {
				t.Errorf("%v: detail %q", err, p.Detail)
			}
		}
		if p := ProblemFor(c.class); p.Status != c.status || p.Detail != c.class.Error() {
			t.Errorf("bare %v: %+v", c.class, p)
		}
	}
}

// TestProblemForInternalHidesDetail proves unclassified errors and
// ErrInternal are 500 internal problems that do not leak their message.
func TestProblemForInternalHidesDetail(t *testing.T) {
	for _, err := range []error{
		errors.New("open /var/lib/forkbox/secret: permission denied by host"),
		fmt.Errorf("runc: %w", errdefs.ErrInternal),
	} {
		p := ProblemFor(err)
		if p.Status != http.StatusInternalServerError || p.Type != "/problems/internal" || p.Detail != "" || p.Field != "" {
			t.Errorf("%v: problem %+v, want an internal problem without detail", err, p)
		}
	}
}

// TestProblemForFieldError proves a *FieldError, bare or wrapped, is an
// invalid-argument problem naming the field, with "field: reason" as detail.
func TestProblemForFieldError(t *testing.T) {
	fe := errdefs.InvalidField("memory_mb", "must be between %d and %d", 64, 65536)
	for _, err := range []error{fe, fmt.Errorf("create session: %w", fe)} {
		p := ProblemFor(err)
		if p.Status != http.StatusBadRequest || p.Type != "/problems/invalid-argument" || p.Field != "memory_mb" ||
			p.Detail != "memory_mb: must be between 64 and 65536" {
			t.Errorf("%v: problem %+v", err, p)
		}
	}
}

// TestProblemTypes proves ProblemTypes lists every class's type and every
// typed problem's once, sorted.
func TestProblemTypes(t *testing.T) {
	types := ProblemTypes()
	all := append(slices.Clone(problemClasses), typedProblems...)
	if len(types) != len(all) || !slices.IsSorted(types) {
		t.Fatalf("ProblemTypes() = %v", types)
	}
	for _, pc := range all {
		if !slices.Contains(types, "/problems/"+pc.slug) {
			t.Errorf("%s missing from %v", pc.slug, types)
		}
	}
	if len(slices.Compact(slices.Clone(types))) != len(types) {
		t.Errorf("duplicate problem types: %v", types)
	}
}

// TestProblemForTypedError proves a policy error keeps its own problem
// type, status, field and detail, wrapped or not, and that a typed error
// whose type is unknown falls back to its class.
func TestProblemForTypedError(t *testing.T) {
	te := errdefs.Typed(errdefs.ErrResourceExhausted, "tenant-concurrency-exceeded", "tenant acme is at its limit of 2 concurrent sessions")
	for _, err := range []error{te, fmt.Errorf("create: %w", te)} {
		p := ProblemFor(err)
		if p.Status != http.StatusTooManyRequests || p.Type != "/problems/tenant-concurrency-exceeded" ||
			p.Detail != "tenant acme is at its limit of 2 concurrent sessions" {
			t.Errorf("%v: problem %+v", err, p)
		}
	}
	img := errdefs.Typed(errdefs.ErrInvalidArgument, "image-not-approved", "template %q is not approved", "x")
	img.Field = "template"
	if p := ProblemFor(img); p.Status != http.StatusBadRequest || p.Type != "/problems/image-not-approved" || p.Field != "template" {
		t.Errorf("image-not-approved: %+v", p)
	}
	odd := errdefs.Typed(errdefs.ErrConflict, "no-such-type", "odd")
	if p := ProblemFor(odd); p.Status != http.StatusConflict || p.Type != "/problems/conflict" {
		t.Errorf("unknown type: %+v", p)
	}
}
