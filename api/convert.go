package api

import (
	v1 "github.com/forkbox/forkbox/api/v1"
	"github.com/forkbox/forkbox/node"
)

// The REST API's wire types (api/v1) are converted to and from the
// Node's domain types here, at the edge, and nowhere else. Types whose
// fields match one to one convert directly.

// createSpec is a create request as the Node takes it.
func createSpec(r v1.CreateRequest) node.CreateSpec {
	return node.CreateSpec{
		Template: r.Template, CPU: r.CPU, MemoryMB: r.MemoryMB, Pids: r.Pids, TimeoutS: r.TimeoutS,
		Env: r.Env, Metadata: r.Metadata, User: r.User, Workdir: r.Workdir, Snapshot: r.Snapshot,
		DiskMB: r.DiskMB, AutoPauseS: r.AutoPauseS, OnTimeout: r.OnTimeout, AutoResume: r.AutoResume,
		Network: nodeNetwork(r.Network), Isolation: r.Isolation, PublicTraffic: r.PublicTraffic,
		Secrets: append([]string(nil), r.Secrets...), Volumes: nodeVolumeMounts(r.Volumes),
	}
}

// nodeVolumeMounts are a request's volume mounts as the Node takes them.
func nodeVolumeMounts(ms []v1.VolumeMount) []node.VolumeMount {
	var out []node.VolumeMount
	for _, m := range ms {
		out = append(out, node.VolumeMount{Name: m.Name, Path: m.Path, ReadOnly: m.ReadOnly})
	}
	return out
}

// apiVolumeMounts are a session's volume mounts as the API reports them.
func apiVolumeMounts(ms []node.VolumeMount) []v1.VolumeMount {
	var out []v1.VolumeMount
	for _, m := range ms {
		out = append(out, v1.VolumeMount{Name: m.Name, Path: m.Path, ReadOnly: m.ReadOnly})
	}
	return out
}

// volumeView is a volume as the API reports it.
func volumeView(v *node.Volume) v1.Volume {
	return v1.Volume{Name: v.Name, SizeMB: v.SizeMB, UsedBytes: v.UsedBytes, CreatedAt: v.CreatedAt,
		WriterSession: v.WriterSession, ReaderSessions: append([]string(nil), v.ReaderSessions...), Session: v.Session}
}

// volumeSnapshotView is a volume snapshot as the API reports it.
func volumeSnapshotView(v *node.VolumeSnapshot) v1.VolumeSnapshot {
	return v1.VolumeSnapshot{ID: v.ID, Name: v.Name, Volume: v.Volume, SizeMB: v.SizeMB, SizeBytes: v.SizeBytes,
		CreatedAt: v.CreatedAt}
}

// nodeNetwork is a request's network policy as the Node takes it.
func nodeNetwork(n *v1.Network) *node.Network {
	if n == nil {
		return nil
	}
	return &node.Network{Allow: append([]string(nil), n.Allow...), MaxEgressBytes: n.MaxEgressBytes,
		MaxConnectionsPerMinute: n.MaxConnectionsPerMinute}
}

// apiNetwork is a session's network policy as the API reports it (nil for none).
func apiNetwork(n *node.Network) *v1.Network {
	if n == nil {
		return nil
	}
	return &v1.Network{Allow: append([]string(nil), n.Allow...), MaxEgressBytes: n.MaxEgressBytes,
		MaxConnectionsPerMinute: n.MaxConnectionsPerMinute}
}

// sessionSecrets is the secret names of a session's network (nil for none).
func sessionSecrets(n *node.Network) []string {
	if n == nil || len(n.Secrets) == 0 {
		return nil
	}
	return append([]string(nil), n.Secrets...)
}

// execResult is a command's end as the API reports it (nil for nil).
func execResult(r *node.ExecResult) *v1.ExecResult {
	if r == nil {
		return nil
	}
	out := v1.ExecResult(*r)
	return &out
}

// entries are directory entries as the API reports them.
func entries(es []node.Entry) []v1.Entry {
	out := make([]v1.Entry, len(es))
	for i, e := range es {
		out[i] = v1.Entry(e)
	}
	return out
}

// entry is one entry as the API reports it.
func entry(e *node.Entry) v1.Entry { return v1.Entry(*e) }

// processes are running commands as the API reports them.
func processes(ps []node.Process) []v1.Process {
	out := make([]v1.Process, len(ps))
	for i, p := range ps {
		out[i] = v1.Process(p)
	}
	return out
}

// poolView is a warm pool as the API reports it.
func poolView(p node.PoolStatus) v1.Pool {
	return v1.Pool{Template: p.Template, Size: p.Size, CPU: p.CPU, MemoryMB: p.MemoryMB, Pids: p.Pids, DiskMB: p.DiskMB,
		Ready: p.Ready, Starting: p.Starting}
}

// info is a Node's description as GET /v1/info reports it.
func info(n node.Info) (drivers []v1.DriverInfo, limits v1.Limits) {
	for _, d := range n.Drivers {
		drivers = append(drivers, v1.DriverInfo(d))
	}
	return drivers, v1.Limits(n.Limits)
}

// pools are warm pools as the API reports them.
func pools(ps []node.PoolStatus) []v1.Pool {
	out := make([]v1.Pool, len(ps))
	for i, p := range ps {
		out[i] = poolView(p)
	}
	return out
}
