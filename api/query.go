package api

import (
	"net/http"
	"strconv"

	"github.com/forkbox/forkbox/errdefs"
)

// boolParam reads the boolean query parameter name of r: absent or empty
// is false; "true", "false", "1", "0" (strconv.ParseBool's words) are
// themselves; anything else is an invalid-argument error naming the
// parameter, never silently false.
func boolParam(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, errdefs.InvalidField(name, "must be true or false, not %q", v)
	}
	return b, nil
}

// oneOf checks that the query parameter name of r is absent or one of
// allowed, and returns it; another value is an invalid-argument error
// naming the parameter.
func oneOf(r *http.Request, name string, allowed ...string) (string, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return "", nil
	}
	for _, a := range allowed {
		if v == a {
			return v, nil
		}
	}
	return "", errdefs.InvalidField(name, "must be one of %q, not %q", allowed, v)
}
