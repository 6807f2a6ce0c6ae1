package e2e

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/internal/testnet"
)

// TestCredentialBrokerSurvivesRestart: a restarted daemon restores an
// adopted session's broker (the same placeholders and CA, from the state
// sealed beside the sandbox), and a secret removed after the restart stops
// at once.
func TestCredentialBrokerSurvivesRestart(t *testing.T) {
	apiLog := &headerLog{got: map[string]http.Header{}}
	serveUpstream(t, testnet.NewHost(t, brokerAPIHost), apiLog)
	o := newOwnDaemon(t)
	ctx := ctxFor(t, 3*time.Minute)
	value := []byte("sk-restart-value-0123456789")
	if _, _, err := o.c.SetSecret(ctx, "apikey", []string{"api.broker.test"}, "", value); err != nil {
		t.Fatal(err)
	}
	s, _, err := o.c.CreateSession(ctx, client.CreateRequest{Secrets: []string{"apikey"},
		Network: &client.Network{Allow: []string{"api.broker.test:443"}}}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := o.c.Upload(ctx, s.ID, "/tmp/broker_probe.py", strings.NewReader(brokerProbe), int64(len(brokerProbe)), ""); err != nil {
		t.Fatal(err)
	}
	probe := func(tag string) string {
		t.Helper()
		out, err := o.c.ExecCollect(ctx, s.ID, client.ExecRequest{Argv: []string{"python3", "/tmp/broker_probe.py", tag}, TimeoutS: 120})
		if err != nil || out.ExitCode != 0 {
			t.Fatalf("probe %s: %+v %v", tag, out, err)
		}
		return string(out.Stdout)
	}
	if out := probe("before"); !strings.Contains(out, `"api": "ok:200"`) {
		t.Fatalf("before the restart: %s", out)
	}
	o.restart(t, nil)
	if out := probe("after"); !strings.Contains(out, `"api": "ok:200"`) {
		t.Fatalf("after the restart: %s", out)
	}
	if h := apiLog.get("api.broker.test/after/x"); h.Get("Authorization") != "Bearer "+string(value) {
		t.Errorf("after the restart the upstream got Authorization %q", h.Get("Authorization"))
	}
	if err := o.c.DeleteSecret(ctx, "apikey"); err != nil {
		t.Fatal(err)
	}
	if out := probe("removed"); !strings.Contains(out, "http:403") {
		t.Errorf("a secret removed after the restart: %s", out)
	}
	if apiLog.get("api.broker.test/removed/x") != nil {
		t.Error("a removed secret's request reached the upstream")
	}
	if err := o.c.DeleteSession(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
}
