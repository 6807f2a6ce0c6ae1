package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/forkbox/forkbox/node"
)

// forwardMode runs the package's daemon with the API in front of a
// second Node implementation, forwardNode, instead of the host's own
// (FORKBOX_E2E_NODE=forward; the Makefile runs the exec, files and
// snapshot tests so). The tests' assertions are the same: passing them
// proves the REST API and the E2B edge reach sessions through the
// node.Node interface alone.
var forwardMode = os.Getenv("FORKBOX_E2E_NODE") == "forward"

// forwardNode is a Node that forwards every call to another Node and
// counts the calls by method.
type forwardNode struct {
	n     node.Node
	mu    sync.Mutex
	calls map[string]int
}

// forwarded is the package's forwardNode in forward mode (else nil).
var forwarded *forwardNode

func newForwardNode(n node.Node) node.Node {
	forwarded = &forwardNode{n: n, calls: map[string]int{}}
	return forwarded
}

func (f *forwardNode) count(method string) {
	f.mu.Lock()
	f.calls[method]++
	f.mu.Unlock()
}

// checkForwarded says which of the methods the exec, files and snapshot
// tests must reach were never called through the forwarding Node.
func (f *forwardNode) checkForwarded() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	var missing, seen []string
	for _, m := range []string{"Create", "Get", "Destroy", "PrepareExec", "Upload", "Download", "ListDir", "Snapshot", "Fork", "DialPort", "SessionDiff", "Merge", "ForkRun"} {
		if f.calls[m] == 0 {
			missing = append(missing, m)
		}
	}
	for m, n := range f.calls {
		seen = append(seen, fmt.Sprintf("%s=%d", m, n))
	}
	sort.Strings(seen)
	fmt.Fprintln(os.Stderr, "e2e: calls forwarded through the second Node:", strings.Join(seen, " "))
	if len(missing) > 0 {
		return fmt.Errorf("never forwarded: %s", strings.Join(missing, ", "))
	}
	return nil
}

func (f *forwardNode) Create(ctx context.Context, spec node.CreateSpec, key string) (*node.Session, bool, error) {
	f.count("Create")
	return f.n.Create(ctx, spec, key)
}

func (f *forwardNode) Get(ctx context.Context, id string) (*node.Session, error) {
	f.count("Get")
	return f.n.Get(ctx, id)
}

func (f *forwardNode) List(ctx context.Context, flt node.SessionFilter) ([]*node.Session, error) {
	f.count("List")
	return f.n.List(ctx, flt)
}

func (f *forwardNode) SetTimeout(ctx context.Context, id string, seconds int64) (*node.Session, error) {
	f.count("SetTimeout")
	return f.n.SetTimeout(ctx, id, seconds)
}

func (f *forwardNode) Pause(ctx context.Context, id string) (*node.Session, error) {
	f.count("Pause")
	return f.n.Pause(ctx, id)
}

func (f *forwardNode) Resume(ctx context.Context, id string) (*node.Session, error) {
	f.count("Resume")
	return f.n.Resume(ctx, id)
}

func (f *forwardNode) Destroy(ctx context.Context, id string) error {
	f.count("Destroy")
	return f.n.Destroy(ctx, id)
}

func (f *forwardNode) Usage(ctx context.Context, id string) (*node.Usage, error) {
	f.count("Usage")
	return f.n.Usage(ctx, id)
}

func (f *forwardNode) Egress(ctx context.Context, id string, skip, limit int) ([]node.EgressRecord, error) {
	f.count("Egress")
	return f.n.Egress(ctx, id, skip, limit)
}

func (f *forwardNode) SetNetwork(ctx context.Context, id string, allow []string) (*node.Session, error) {
	f.count("SetNetwork")
	return f.n.SetNetwork(ctx, id, allow)
}

func (f *forwardNode) Logs(ctx context.Context, id string, since time.Time, limit int) ([]node.LogLine, error) {
	f.count("Logs")
	return f.n.Logs(ctx, id, since, limit)
}

func (f *forwardNode) UsageHistory(ctx context.Context, id string, from, to time.Time) ([]node.UsageSample, error) {
	f.count("UsageHistory")
	return f.n.UsageHistory(ctx, id, from, to)
}

func (f *forwardNode) DeleteSnapshotKeepDependents(ctx context.Context, id string) error {
	f.count("DeleteSnapshotKeepDependents")
	return f.n.DeleteSnapshotKeepDependents(ctx, id)
}

func (f *forwardNode) Info() node.Info {
	f.count("Info")
	return f.n.Info()
}

func (f *forwardNode) TemplateUsable(ctx context.Context, name string) bool {
	f.count("TemplateUsable")
	return f.n.TemplateUsable(ctx, name)
}

func (f *forwardNode) PrepareExec(ctx context.Context, id string, bodyBytes int64) (node.ExecCall, error) {
	f.count("PrepareExec")
	return f.n.PrepareExec(ctx, id, bodyBytes)
}

func (f *forwardNode) Exec(ctx context.Context, id string, spec node.ExecSpec, out node.Output) (*node.ExecResult, error) {
	f.count("Exec")
	return f.n.Exec(ctx, id, spec, out)
}

func (f *forwardNode) Attach(ctx context.Context, id string, pid int, out node.Output) (*node.ExecResult, error) {
	f.count("Attach")
	return f.n.Attach(ctx, id, pid, out)
}

func (f *forwardNode) ProcessList(ctx context.Context, id string) ([]node.Process, error) {
	f.count("ProcessList")
	return f.n.ProcessList(ctx, id)
}

func (f *forwardNode) Signal(ctx context.Context, id string, pid int, sig int) error {
	f.count("Signal")
	return f.n.Signal(ctx, id, pid, sig)
}

func (f *forwardNode) SendStdin(ctx context.Context, id string, pid int, data []byte, closeAfter bool) error {
	f.count("SendStdin")
	return f.n.SendStdin(ctx, id, pid, data, closeAfter)
}

func (f *forwardNode) Upload(ctx context.Context, id, path, user string, body io.Reader, size int64) (*node.Entry, error) {
	f.count("Upload")
	return f.n.Upload(ctx, id, path, user, body, size)
}

func (f *forwardNode) Download(ctx context.Context, id, path, user string) (io.ReadCloser, int64, error) {
	f.count("Download")
	return f.n.Download(ctx, id, path, user)
}

func (f *forwardNode) Stat(ctx context.Context, id, path, user string) (*node.Entry, error) {
	f.count("Stat")
	return f.n.Stat(ctx, id, path, user)
}

func (f *forwardNode) ListDir(ctx context.Context, id, path, user string, depth int) ([]node.Entry, error) {
	f.count("ListDir")
	return f.n.ListDir(ctx, id, path, user, depth)
}

func (f *forwardNode) MakeDir(ctx context.Context, id, path, user string) (*node.Entry, error) {
	f.count("MakeDir")
	return f.n.MakeDir(ctx, id, path, user)
}

func (f *forwardNode) Move(ctx context.Context, id, source, destination, user string) (*node.Entry, error) {
	f.count("Move")
	return f.n.Move(ctx, id, source, destination, user)
}

func (f *forwardNode) Remove(ctx context.Context, id, path, user string) error {
	f.count("Remove")
	return f.n.Remove(ctx, id, path, user)
}

func (f *forwardNode) CheckEnvdToken(ctx context.Context, id, token string) (*node.Session, error) {
	f.count("CheckEnvdToken")
	return f.n.CheckEnvdToken(ctx, id, token)
}

func (f *forwardNode) OpenEnvd(ctx context.Context, id string) (*node.EnvdConn, error) {
	f.count("OpenEnvd")
	return f.n.OpenEnvd(ctx, id)
}

func (f *forwardNode) AgentHealthy(ctx context.Context, id string) error {
	f.count("AgentHealthy")
	return f.n.AgentHealthy(ctx, id)
}

func (f *forwardNode) DialPort(ctx context.Context, id string, port int) (net.Conn, error) {
	f.count("DialPort")
	return f.n.DialPort(ctx, id, port)
}

func (f *forwardNode) Snapshot(ctx context.Context, id string, opts node.SnapshotOptions) (*node.Snapshot, error) {
	f.count("Snapshot")
	return f.n.Snapshot(ctx, id, opts)
}

func (f *forwardNode) Fork(ctx context.Context, ref string, count int, spec node.CreateSpec) ([]*node.Session, error) {
	f.count("Fork")
	return f.n.Fork(ctx, ref, count, spec)
}

func (f *forwardNode) ForkSession(ctx context.Context, id string, count int, spec node.CreateSpec, opts node.SnapshotOptions) (*node.Snapshot, []*node.Session, error) {
	f.count("ForkSession")
	return f.n.ForkSession(ctx, id, count, spec, opts)
}

func (f *forwardNode) GetSnapshot(ctx context.Context, ref string) (*node.Snapshot, error) {
	f.count("GetSnapshot")
	return f.n.GetSnapshot(ctx, ref)
}

func (f *forwardNode) ListSnapshots(ctx context.Context) ([]*node.Snapshot, error) {
	f.count("ListSnapshots")
	return f.n.ListSnapshots(ctx)
}

func (f *forwardNode) DeleteSnapshot(ctx context.Context, id string, force bool) error {
	f.count("DeleteSnapshot")
	return f.n.DeleteSnapshot(ctx, id, force)
}

func (f *forwardNode) SetPool(ctx context.Context, p node.Pool) (node.PoolStatus, error) {
	f.count("SetPool")
	return f.n.SetPool(ctx, p)
}

func (f *forwardNode) PoolList() []node.PoolStatus {
	f.count("PoolList")
	return f.n.PoolList()
}

func (f *forwardNode) TenantSessions(tenant string) int {
	f.count("TenantSessions")
	return f.n.TenantSessions(tenant)
}

func (f *forwardNode) EndTenant(ctx context.Context, tenant string) error {
	f.count("EndTenant")
	return f.n.EndTenant(ctx, tenant)
}

func (f *forwardNode) ReserveQuota(ctx context.Context, tenant, what string, count func() (int, error)) (func(), error) {
	f.count("ReserveQuota")
	return f.n.ReserveQuota(ctx, tenant, what, count)
}

func (f *forwardNode) SessionDiff(ctx context.Context, id string, opts node.DiffOptions) (*node.Diff, error) {
	f.count("SessionDiff")
	return f.n.SessionDiff(ctx, id, opts)
}

func (f *forwardNode) SnapshotDiff(ctx context.Context, ref string, opts node.DiffOptions) (*node.Diff, error) {
	f.count("SnapshotDiff")
	return f.n.SnapshotDiff(ctx, ref, opts)
}

func (f *forwardNode) Merge(ctx context.Context, id string, spec node.MergeSpec) (*node.MergeResult, error) {
	f.count("Merge")
	return f.n.Merge(ctx, id, spec)
}

func (f *forwardNode) ForkRun(ctx context.Context, ref string, count int, spec node.CreateSpec, run node.ForkRunSpec, emit func(node.ForkChildResult)) (*node.ForkRunSummary, error) {
	f.count("ForkRun")
	return f.n.ForkRun(ctx, ref, count, spec, run, emit)
}

func (f *forwardNode) CreateVolume(ctx context.Context, name string, sizeMB int64, from string) (*node.Volume, error) {
	f.count("CreateVolume")
	return f.n.CreateVolume(ctx, name, sizeMB, from)
}

func (f *forwardNode) ListVolumes(ctx context.Context) ([]*node.Volume, error) {
	f.count("ListVolumes")
	return f.n.ListVolumes(ctx)
}

func (f *forwardNode) GetVolume(ctx context.Context, name string) (*node.Volume, error) {
	f.count("GetVolume")
	return f.n.GetVolume(ctx, name)
}

func (f *forwardNode) DeleteVolume(ctx context.Context, name string) error {
	f.count("DeleteVolume")
	return f.n.DeleteVolume(ctx, name)
}

func (f *forwardNode) SnapshotVolume(ctx context.Context, name, snapName string) (*node.VolumeSnapshot, error) {
	f.count("SnapshotVolume")
	return f.n.SnapshotVolume(ctx, name, snapName)
}

func (f *forwardNode) ListVolumeSnapshots(ctx context.Context, name string) ([]*node.VolumeSnapshot, error) {
	f.count("ListVolumeSnapshots")
	return f.n.ListVolumeSnapshots(ctx, name)
}

func (f *forwardNode) DeleteVolumeSnapshot(ctx context.Context, name, ref string) error {
	f.count("DeleteVolumeSnapshot")
	return f.n.DeleteVolumeSnapshot(ctx, name, ref)
}
