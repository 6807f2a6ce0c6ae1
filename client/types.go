package client

import v1 "github.com/forkbox/forkbox/api/v1"

// The wire types, named in this package so that callers need not import
// api/v1; see that package for their fields and units.
type (
	CreateRequest   = v1.CreateRequest
	Session         = v1.Session
	ExecRequest     = v1.ExecRequest
	ExecResult      = v1.ExecResult
	ExecOutput      = v1.ExecOutput
	Process         = v1.Process
	Entry           = v1.Entry
	Usage           = v1.Usage
	Network         = v1.Network
	EgressRecord    = v1.EgressRecord
	Template        = v1.Template
	Info            = v1.Info
	Snapshot        = v1.Snapshot
	SnapshotRequest = v1.SnapshotRequest
	ForkRequest     = v1.ForkRequest
	ForkResult      = v1.ForkResult
	Pool            = v1.Pool
	TenantPolicy    = v1.TenantPolicy
	Tenant          = v1.Tenant
	TenantRequest   = v1.TenantRequest
	APIKey          = v1.APIKey
	KeyRequest      = v1.KeyRequest
	NewKey          = v1.NewKey
	AuditRecord     = v1.AuditRecord
	AuditList       = v1.AuditList
	Secret          = v1.Secret
	Volume          = v1.Volume
	VolumeMount     = v1.VolumeMount
	VolumeRequest   = v1.VolumeRequest
	VolumeSnapshot  = v1.VolumeSnapshot
	SecretRequest   = v1.SecretRequest
	Host            = v1.Host
	HostList        = v1.HostList
)
