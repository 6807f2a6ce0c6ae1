package e2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/forkbox/forkbox/client"
)

// Attacks on the egress fence: a sandbox that may reach a name makes that
// name lead somewhere it must never reach.

// specialNames are allowed names that resolve into ranges that are not
// globally reachable, with the range each must be refused as. Only IPv6
// ranges here: an IPv4 documentation address could be routed off this
// machine if the fence were wrong (netpolicy's unit tests cover every
// range, both families).
var specialNames = map[string]struct{ addr, in string }{
	"sitelocal.test": {"fec0::1", "fec0::/10"},
	"doc6.test":      {"2001:db8::1", "2001:db8::/32"},
	"doc6b.test":     {"3fff::1", "3fff::/20"},
	"srv6.test":      {"5f00::1", "5f00::/16"},
	"bench6.test":    {"2001:2::1", "2001:2::/48"},
	"dummy6.test":    {"100:0:0:1::1", "100:0:0:1::/64"},
}

func init() {
	for name, s := range specialNames {
		egressNames[name] = []netip.Addr{netip.MustParseAddr(s.addr)}
	}
}

// TestHostileEgressSpecialRanges: the allow-list names hosts whose DNS
// points into IPv6 site-local, documentation, SRv6 and other special
// ranges (a rebinding that aims at a network the fence did not know).
// Every path out refuses them: the proxy (403), transparent HTTP (403),
// transparent TLS, and the sandbox's DNS (no address); each refusal is
// recorded naming the range. fec0::/10 was proxied before.
func TestHostileEgressSpecialRanges(t *testing.T) {
	need(t)
	var allow, names []string
	for name := range specialNames {
		allow = append(allow, name+":80", name+":443")
		names = append(names, name)
	}
	s := newSession(t, client.CreateRequest{Network: &client.Network{Allow: allow}})
	script := `
import json, socket, ssl, sys, urllib.request, urllib.error, http.client
res = {}
def attempt(key, fn):
    try:
        res[key] = "ok:" + str(fn())
    except urllib.error.HTTPError as e:
        res[key] = "http:" + str(e.code)
    except Exception as e:
        res[key] = "err:" + type(e).__name__
def proxy(name):
    with urllib.request.urlopen("http://" + name + "/", timeout=20) as r:
        return r.status
def transparent(name):
    c = http.client.HTTPConnection("198.51.100.40", 80, timeout=20)
    c.request("GET", "/", headers={"Host": name})
    return c.getresponse().status
def tls(name):
    s = socket.create_connection(("198.51.100.40", 443), timeout=20)
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    return ctx.wrap_socket(s, server_hostname=name).version()
def dns(name):
    return socket.getaddrinfo(name, 80, socket.AF_INET6)[0][4][0]
for name in sys.argv[1:]:
    attempt(name + " proxy", lambda: proxy(name))
    attempt(name + " transparent", lambda: transparent(name))
    attempt(name + " tls", lambda: tls(name))
    attempt(name + " dns", lambda: dns(name))
print(json.dumps(res))
`
	res, out, errOut := run(t, s.ID, client.ExecRequest{Argv: append([]string{"python3", "-c", script}, names...), TimeoutS: 110})
	if res.ExitCode != 0 {
		t.Fatalf("probe: exit %d\n%s\n%s", res.ExitCode, out, errOut)
	}
	var got map[string]string
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("probe output: %v\n%s", err, out)
	}
	for _, name := range names {
		for path, want := range map[string]string{"proxy": "http:403", "transparent": "ok:403", "tls": "err:", "dns": "err:gaierror"} {
			if k := name + " " + path; !strings.HasPrefix(got[k], want) {
				t.Errorf("%s (%s): %q, want %q", k, specialNames[name].addr, got[k], want)
			}
		}
	}

	// Every refusal is a deny record naming the range (records are
	// written in batches: poll).
	missing := func(recs []client.EgressRecord) []string {
		var out []string
		for _, name := range names {
			for _, kind := range []string{"http", "tls", "dns"} {
				found := false
				for _, r := range recs {
					found = found || (r.Host == name && r.Kind == kind && r.Decision == "deny" &&
						strings.Contains(r.Reason, specialNames[name].in))
				}
				if !found {
					out = append(out, fmt.Sprintf("%s %s deny (%s)", kind, name, specialNames[name].in))
				}
			}
		}
		return out
	}
	recs := waitEgress(t, s.ID, missing)
	if m := missing(recs); len(m) > 0 {
		t.Errorf("records missing: %v", m)
		for _, r := range recs {
			t.Logf("record: %s %s %s %s", r.Kind, r.Host, r.Decision, r.Reason)
		}
	}
}
