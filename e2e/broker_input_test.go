package e2e

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/errdefs"
)

// TestCredentialBrokerBadInput: bad secrets and sessions asking for
// secrets they cannot have are refused with the field named, and leave
// nothing behind; the CLI sets, lists (never values) and removes.
func TestCredentialBrokerBadInput(t *testing.T) {
	need(t)
	ctx := ctxFor(t, 2*time.Minute)
	field := func(err error) string {
		var e *client.Error
		if errors.As(err, &e) {
			return e.Field
		}
		return ""
	}
	for _, c := range []struct {
		field, header string
		hosts         []string
		value         string
	}{
		{"hosts", "", []string{"10.1.2.3"}, "v"},
		{"hosts", "", []string{"169.254.169.254"}, "v"},
		{"hosts", "", nil, "v"},
		{"header", "Authorization: Bearer", []string{"api.broker.test"}, "v"},
		{"value", "", []string{"api.broker.test"}, strings.Repeat("x", 64<<10+1)},
		{"value", "", []string{"api.broker.test"}, ""},
	} {
		_, _, err := env.c.SetSecret(ctx, "badinput", c.hosts, c.header, []byte(c.value))
		if !errors.Is(err, errdefs.ErrInvalidArgument) || field(err) != c.field {
			t.Errorf("set with %s %q %v (%d bytes): %v, want 400 naming %s", c.field, c.header, c.hosts, len(c.value), err, c.field)
		}
	}
	if ss, err := env.c.Secrets(ctx); err != nil {
		t.Fatal(err)
	} else {
		for _, s := range ss {
			if s.Name == "badinput" {
				t.Fatal("a refused secret was stored")
			}
		}
	}

	// The CLI: set from stdin, ls without values, rm.
	out, errOut, code := forkbox(t, "cli-value-123\n", "secret", "set", "clisecret", "--host", "api.broker.test",
		"--header", "Authorization: Bearer {value}")
	if code != 0 || !strings.Contains(out, "clisecret created") {
		t.Fatalf("secret set: %d %s %s", code, out, errOut)
	}
	out, _, code = forkbox(t, "", "secret", "ls")
	if code != 0 || !strings.Contains(out, "clisecret") || !strings.Contains(out, "Authorization: Bearer {value}") ||
		strings.Contains(out, "cli-value-123") {
		t.Fatalf("secret ls: %d\n%s", code, out)
	}
	_, errOut, code = forkbox(t, "v", "secret", "set", "clibad", "--host", "api.broker.test", "--header", "X: none")
	if code == 0 || !strings.Contains(errOut, "header") {
		t.Fatalf("secret set with a bad header: %d %s", code, errOut)
	}

	// Sessions: a secret needs a network that allows its hosts, and must
	// be the caller's tenant's.
	before, err := env.c.ListSessions(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, _, tc := newTenant(t, env.c, "brokertenant", client.TenantPolicy{EgressAllow: []string{"*"}})
	net := &client.Network{Allow: []string{"api.broker.test:443"}}
	for _, c := range []struct {
		name  string
		c     *client.Client
		req   client.CreateRequest
		field string
	}{
		{"no network", env.c, client.CreateRequest{Secrets: []string{"clisecret"}}, "secrets"},
		{"unknown", env.c, client.CreateRequest{Secrets: []string{"nosuchsecret"}, Network: net}, "secrets[0]"},
		{"host not allowed", env.c, client.CreateRequest{Secrets: []string{"clisecret"},
			Network: &client.Network{Allow: []string{"b.broker.test:443"}}}, "secrets[0]"},
		{"another tenant's", tc, client.CreateRequest{Secrets: []string{"clisecret"}, Network: net}, "secrets[0]"},
	} {
		_, _, err := c.c.CreateSession(ctx, c.req, "")
		if !errors.Is(err, errdefs.ErrInvalidArgument) || field(err) != c.field {
			t.Errorf("%s: %v, want 400 naming %s", c.name, err, c.field)
		}
		if c.name != "no network" && !strings.Contains(err.Error(), "clisecret") && !strings.Contains(err.Error(), "nosuchsecret") {
			t.Errorf("%s: the error does not name the secret: %v", c.name, err)
		}
	}
	after, err := env.c.ListSessions(ctx, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Errorf("refused creates left sessions: %d before, %d after", len(before), len(after))
	}

	out, errOut, code = forkbox(t, "", "secret", "rm", "clisecret")
	if code != 0 || strings.TrimSpace(out) != "clisecret" {
		t.Fatalf("secret rm: %d %s %s", code, out, errOut)
	}
	if _, _, code = forkbox(t, "", "secret", "rm", "clisecret"); code == 0 {
		t.Fatal("removing a removed secret succeeded")
	}
}
