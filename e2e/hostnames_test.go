package e2e

import (
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"

	"github.com/forkbox/forkbox/client"
	"github.com/forkbox/forkbox/daemon"
	"github.com/forkbox/forkbox/datadir"
	"github.com/forkbox/forkbox/internal/testnet"
	"github.com/forkbox/forkbox/netpolicy"
)

// The test host of the daemons' sessions here.
const hostNamesHost = "198.51.100.43"

func init() {
	egressNames["twodaemons.test"] = []netip.Addr{netip.MustParseAddr(hostNamesHost)}
}

// fetchTwoDaemons fetches http://twodaemons.test/ in session id of c and
// returns what it printed.
func fetchTwoDaemons(t *testing.T, c *client.Client, id string) string {
	t.Helper()
	res, err := c.ExecCollect(ctxFor(t, time.Minute), id, client.ExecRequest{Argv: []string{"python3", "-c",
		`import urllib.request; print(urllib.request.urlopen("http://twodaemons.test/", timeout=10).read().decode())`}})
	if err != nil {
		return "error: " + err.Error()
	}
	return strings.TrimSpace(string(res.Stdout) + string(res.Stderr))
}

// hostTable returns the tags (user data) of the rules in the input chain
// of host table name; ok false when the table is not there.
func hostTable(t *testing.T, name string) (tags []string, ok bool) {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ListTableOfFamily(name, nftables.TableFamilyINet); err != nil {
		return nil, false
	}
	tbl := &nftables.Table{Family: nftables.TableFamilyINet, Name: name}
	rules, err := c.GetRules(tbl, &nftables.Chain{Name: "sandboxes_in", Table: tbl})
	if err != nil {
		t.Fatalf("rules of table %s: %v", name, err)
	}
	for _, r := range rules {
		tags = append(tags, string(r.UserData))
	}
	return tags, true
}

// addProbe appends a rule that matches nothing, tagged tag, to host table
// name: it is there as long as nobody replaces the table.
func addProbe(t *testing.T, name, tag string) {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tbl := &nftables.Table{Family: nftables.TableFamilyINet, Name: name}
	c.AddRule(&nftables.Rule{Table: tbl, Chain: &nftables.Chain{Name: "sandboxes_in", Table: tbl}, UserData: []byte(tag),
		Exprs: []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte("fbxprobe-none\x00")},
			&expr.Verdict{Kind: expr.VerdictDrop}}})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
}

// cgroupInodes returns sandbox id's cgroup directories with their inode
// numbers: a directory removed and made again has another.
func cgroupInodes(t *testing.T, id string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, d := range cgroupDirs("*", id) {
		var st syscall.Stat_t
		if err := syscall.Stat(d, &st); err == nil {
			out[d] = st.Ino
		}
	}
	return out
}

// linkGroupOf returns the interface group of session id's host link.
func linkGroupOf(t *testing.T, id string) uint32 {
	t.Helper()
	l, err := netlink.LinkByName(netpolicy.HostLinkName(id))
	if err != nil {
		t.Fatalf("host link of %s: %v", id, err)
	}
	return l.Attrs().Group
}

// TestTwoDaemonsOnOneHost: two daemons on two data directories, each with
// an egress session. Each has its own cgroup parent, nftables table and
// link group; restarting one leaves the other's egress working, its table
// as it was (a rule only this test added is still there) and its cgroups
// untouched (same directories, same inodes). Every daemon used to share
// the cgroup parent /forkbox and the table "forkbox", which each start
// deleted and made again.
func TestTwoDaemonsOnOneHost(t *testing.T) {
	newHostNamesTestHost(t)
	a, b := newOwnDaemon(t), newOwnDaemon(t)
	namesA, namesB := datadir.Layout{Root: a.dataDir}.HostNames(), datadir.Layout{Root: b.dataDir}.HostNames()
	if namesA == namesB {
		t.Fatalf("two data directories, one set of host names: %+v", namesA)
	}
	ctx := ctxFor(t, 3*time.Minute)
	net := &client.Network{Allow: []string{"twodaemons.test:80"}}
	sa, _, err := a.c.CreateSession(ctx, client.CreateRequest{Network: net}, "")
	if err != nil {
		t.Fatal(err)
	}
	sb, _, err := b.c.CreateSession(ctx, client.CreateRequest{Network: net}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		o     *ownDaemon
		id    string
		names datadir.HostNames
	}{{a, sa.ID, namesA}, {b, sb.ID, namesB}} {
		if got := fetchTwoDaemons(t, c.o.c, c.id); got != "hello" {
			t.Fatalf("egress of %s: %q", c.id, got)
		}
		for d := range cgroupInodes(t, c.id) {
			if !strings.Contains(d, "/"+c.names.CgroupParent+"/") {
				t.Errorf("cgroup %s is not under its daemon's parent %s", d, c.names.CgroupParent)
			}
		}
		if g := linkGroupOf(t, c.id); g != c.names.LinkGroup {
			t.Errorf("link of %s in group %d, want its daemon's %d", c.id, g, c.names.LinkGroup)
		}
		if _, ok := hostTable(t, c.names.NftTable); !ok {
			t.Errorf("no host table %s", c.names.NftTable)
		}
	}
	addProbe(t, namesB.NftTable, "probe-of-this-test")
	inodes := cgroupInodes(t, sb.ID)
	if len(inodes) == 0 {
		t.Fatal("no cgroups of B's session")
	}

	a.restart(t, func() {
		// While A is down, B's sandbox still gets out.
		if got := fetchTwoDaemons(t, b.c, sb.ID); got != "hello" {
			t.Errorf("B's egress while A is down: %q", got)
		}
	})
	if got := fetchTwoDaemons(t, b.c, sb.ID); got != "hello" {
		t.Errorf("B's egress after A's restart: %q", got)
	}
	if got := fetchTwoDaemons(t, a.c, sa.ID); got != "hello" {
		t.Errorf("A's egress after its restart: %q", got)
	}
	if tags, ok := hostTable(t, namesB.NftTable); !ok || !strings.Contains(strings.Join(tags, " "), "probe-of-this-test") {
		t.Errorf("A's restart replaced B's table %s (present %v, rule tags %q)", namesB.NftTable, ok, tags)
	}
	if after := cgroupInodes(t, sb.ID); fmt.Sprint(after) != fmt.Sprint(inodes) {
		t.Errorf("B's cgroups changed across A's restart: %v, before %v", after, inodes)
	}
}

// newHostNamesTestHost serves "hello" over HTTP on hostNamesHost.
func newHostNamesTestHost(t *testing.T) {
	t.Helper()
	need(t)
	h := testnet.NewHost(t, hostNamesHost)
	h.ServeHTTP(t, 80, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "hello") }))
}

// TestUpgradeAdoptsLegacySandboxes: sessions made by a daemon of the
// previous version (cgroups under /forkbox, its links in no group, fenced
// by the shared table "forkbox") are adopted by the new daemon on the same
// data directory: they keep working, their egress too, their links join
// the new daemon's group and table, their usage is read from the old
// cgroups, and destroying them removes everything where it is. The shared
// table goes once no link of a previous version is left on the host.
func TestUpgradeAdoptsLegacySandboxes(t *testing.T) {
	newHostNamesTestHost(t)
	legacy := datadir.LegacyHostNames()
	o := newOwnDaemonWith(t, func(opts *daemon.Options) { opts.HostNames = &legacy })
	names := datadir.Layout{Root: o.dataDir}.HostNames()
	ctx := ctxFor(t, 3*time.Minute)
	s, _, err := o.c.CreateSession(ctx, client.CreateRequest{Network: &client.Network{Allow: []string{"twodaemons.test:80"}}}, "")
	if err != nil {
		t.Fatal(err)
	}
	plain, _, err := o.c.CreateSession(ctx, client.CreateRequest{}, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{s.ID, plain.ID} {
		for d := range cgroupInodes(t, id) {
			if !strings.Contains(d, "/forkbox/"+id) {
				t.Fatalf("the previous version's cgroup %s is not under /forkbox", d)
			}
		}
	}
	if g := linkGroupOf(t, s.ID); g != 0 {
		t.Fatalf("the previous version's link is in group %d", g)
	}
	sh := func(id string) string {
		res, err := o.c.ExecCollect(ctxFor(t, time.Minute), id, client.ExecRequest{Cmd: "echo up; head -c 1000000 /dev/zero | sha256sum >/dev/null"})
		if err != nil {
			return err.Error()
		}
		return strings.TrimSpace(string(res.Stdout))
	}

	o.tune = nil // the new version
	o.restart(t, nil)
	for _, id := range []string{s.ID, plain.ID} {
		if got := sh(id); got != "up" {
			t.Errorf("adopted session %s: %q", id, got)
		}
		u, err := o.c.Usage(ctx, id)
		if err != nil || u.CPUSeconds <= 0 || u.Pids < 1 {
			t.Errorf("usage of adopted session %s (its cgroups are under /forkbox): %+v %v", id, u, err)
		}
	}
	if got := fetchTwoDaemons(t, o.c, s.ID); got != "hello" {
		t.Errorf("egress of the adopted session: %q", got)
	}
	if g := linkGroupOf(t, s.ID); g != names.LinkGroup {
		t.Errorf("adopted link in group %d, want the new daemon's %d", g, names.LinkGroup)
	}
	if _, ok := hostTable(t, names.NftTable); !ok {
		t.Errorf("the new daemon has no table %s", names.NftTable)
	}
	// The shared table is gone unless another daemon of the previous
	// version on this host still has a sandbox link.
	links, _ := netlink.LinkList()
	others := 0
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, "fbx") && l.Attrs().Group == 0 {
			others++
		}
	}
	if _, ok := hostTable(t, netpolicy.LegacyHostTable); ok && others == 0 {
		t.Errorf("the shared table %q outlived the last link of the previous version", netpolicy.LegacyHostTable)
	} else if ok {
		t.Logf("the shared table stays: %d links of other daemons of the previous version", others)
	}
	for _, id := range []string{s.ID, plain.ID} {
		if err := o.c.DeleteSession(ctx, id); err != nil {
			t.Fatal(err)
		}
		assertGone(t, o.dataDir, id)
	}
	if _, err := os.Stat("/sys/class/net/" + netpolicy.HostLinkName(s.ID)); !os.IsNotExist(err) {
		t.Errorf("the adopted session's link outlived it: %v", err)
	}
}
