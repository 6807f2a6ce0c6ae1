package build

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/storage"
)

// TestHealthcheckIsTheReadyCheck checks the Dockerfile mapping of
// HEALTHCHECK: the shell form runs with /bin/sh -c, the exec form as
// given, --start-period is the wait (rounded up to seconds), the other
// options are accepted, a later HEALTHCHECK replaces an earlier one and
// NONE clears it (an inherited one too).
func TestHealthcheckIsTheReadyCheck(t *testing.T) {
	cases := []struct {
		df       string
		inherit  []string
		argv     []string
		timeoutS int64
	}{
		{"FROM base\nHEALTHCHECK CMD curl -fs localhost:3000\n", nil,
			[]string{"/bin/sh", "-c", "curl -fs localhost:3000"}, 0},
		{"FROM base\nHEALTHCHECK --interval=5s --timeout=2s --retries=3 --start-interval=1s --start-period=1500ms CMD [\"test\", \"-e\", \"/tmp/up\"]\n", nil,
			[]string{"test", "-e", "/tmp/up"}, 2},
		{"FROM base\nHEALTHCHECK CMD false\nHEALTHCHECK --start-period=30s CMD true\n", nil,
			[]string{"/bin/sh", "-c", "true"}, 30},
		{"FROM base\nHEALTHCHECK CMD true\nHEALTHCHECK NONE\n", nil, nil, 0},
		{"FROM base\nHEALTHCHECK NONE\n", []string{"inherited"}, nil, 0},
		{"FROM base\nRUN true\n", []string{"inherited"}, []string{"inherited"}, 0},
	}
	for _, c := range cases {
		r := planFrom(t, c.df, c.inherit)
		if !reflect.DeepEqual(r.st.ready, c.argv) || r.st.readyS != c.timeoutS {
			t.Errorf("%q: ready %q (%d s), want %q (%d s)", c.df, r.st.ready, r.st.readyS, c.argv, c.timeoutS)
		}
	}
}

// planFrom plans df's steps as build() does, starting from inherited as
// the FROM template's ready check, and returns the run.
func planFrom(t *testing.T, df string, inherited []string) *run {
	t.Helper()
	r, _, _ := planOf(t, "FROM base\n", nil, nil)
	r.st.ready = inherited
	f, err := Parse([]byte(df))
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range f.Instrs {
		if _, err := r.plan(context.Background(), in); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// TestHealthcheckTooLong checks that an over-long HEALTHCHECK command is
// a dockerfile error naming the line, and that the bound does not count
// the /bin/sh -c the E2B edge writes before a ready line.
func TestHealthcheckTooLong(t *testing.T) {
	long := strings.Repeat("x", storage.MaxReadyCmdBytes+1)
	_, err := Parse([]byte("FROM base\nHEALTHCHECK CMD " + long + "\n"))
	if errdefs.Field(err) != "dockerfile" || !strings.Contains(err.Error(), "line 2: HEALTHCHECK's command is") {
		t.Fatalf("over-long HEALTHCHECK: %v", err)
	}
	most := strings.Repeat("x", storage.MaxReadyCmdBytes)
	if _, err := Parse([]byte("FROM base\nHEALTHCHECK CMD [\"/bin/sh\", \"-c\", \"" + most + "\"]\n")); err != nil {
		t.Fatalf("a ready line of the most bytes: %v", err)
	}
}

// TestReadyLine checks the ready_cmd field's rules: a shell line run
// with /bin/sh -c; empty, blank, over-long or NUL-holding lines are
// refused naming the field.
func TestReadyLine(t *testing.T) {
	argv, err := ReadyLine("ready_cmd", "curl -fs localhost:3000")
	if err != nil || !reflect.DeepEqual(argv, []string{"/bin/sh", "-c", "curl -fs localhost:3000"}) {
		t.Fatalf("ReadyLine = %q, %v", argv, err)
	}
	for _, bad := range []string{"", "  \t", strings.Repeat("y", storage.MaxReadyCmdBytes+1), "a\x00b"} {
		_, err := ReadyLine("ready_cmd", bad)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.Field(err) != "ready_cmd" {
			t.Errorf("ReadyLine(%.20q) = %v, want a ready_cmd field error", bad, err)
		}
	}
	for _, s := range []int64{-1, storage.MaxReadyTimeoutS + 1} {
		if err := ReadyTimeout("ready_timeout_s", s); errdefs.Field(err) != "ready_timeout_s" {
			t.Errorf("ReadyTimeout(%d) = %v", s, err)
		}
	}
	if err := ReadyTimeout("ready_timeout_s", storage.MaxReadyTimeoutS); err != nil {
		t.Error(err)
	}
}
