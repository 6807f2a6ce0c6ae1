package access

import (
	"net/http/httptest"
	"testing"
)

// TestBearerToken proves the Bearer scheme is matched in any case and with
// any spaces or tabs before the token (RFC 9110 §11.1, §11.4), and that
// other schemes and malformed values give no token.
func TestBearerToken(t *testing.T) {
	for in, want := range map[string]string{
		"Bearer k1": "k1", "bearer k1": "k1", "BEARER k1": "k1", "bEaReR   k1": "k1", "Bearer\tk1": "k1",
		" Bearer k1 ": "k1", "Bearer": "", "Bearer ": "", "Basic dXNlcjo=": "", "Bearerk1": "", "": "", "Token k1": "",
	} {
		if got := BearerToken(in); got != want {
			t.Errorf("BearerToken(%q) = %q, want %q", in, got, want)
		}
	}
	r := httptest.NewRequest("GET", "/v1/info", nil)
	r.Header.Set("Authorization", "bearer k2")
	if got := Secret(r, false); got != "k2" {
		t.Errorf("Secret with a lower-case scheme: %q", got)
	}
	r.Header.Set("X-API-Key", "k3")
	if Secret(r, false) != "k2" || Secret(r, true) != "k3" {
		t.Errorf("Secret with both: %q / %q", Secret(r, false), Secret(r, true))
	}
}
