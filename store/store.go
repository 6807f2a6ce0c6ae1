// Package store keeps forkbox's durable state in SQLite (through the pure-Go
// modernc.org/sqlite driver): sessions, templates and API keys. The schema
// is versioned; Open applies pending migrations in order inside one
// transaction each and records the version in PRAGMA user_version.
//
// Not-found and uniqueness failures come back wrapped in errdefs.ErrNotFound
// and errdefs.ErrConflict; callers never see sql.ErrNoRows or driver codes.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/forkbox/forkbox/errdefs"
)

// Store is the database handle. It is safe for concurrent use.
type Store struct {
	db *sql.DB
	// ro serves long reads (the audit trail) on connections of their own,
	// so that they never queue the writes every request makes on db.
	ro *sql.DB
	// auditIns is insertAuditSQL prepared on db; auditQ batches the
	// audit records that arrive together into one commit.
	auditIns *sql.Stmt
	auditQ   auditQueue

	keyMu    sync.Mutex
	keyCache map[string]APIKey // by key hash: keys that authenticated recently
	keyGen   uint64            // counts cache clears (forgetKeys)

	// changed and audited are told of changes to shared records and of
	// appended audit records (OnChange, OnAudit; shared.go).
	changed func(Change)
	audited func()
}

// migrations are applied in order; migration i brings the schema to
// version i+1. Never edit a released migration: append a new one.
var migrations = []string{
	// 1: sessions, templates, API keys.
	`CREATE TABLE sessions (
		id              TEXT PRIMARY KEY,
		template        TEXT NOT NULL,
		driver          TEXT NOT NULL,
		state           TEXT NOT NULL,
		reason          TEXT NOT NULL DEFAULT '',
		detail          TEXT NOT NULL DEFAULT '',
		cpu             REAL NOT NULL,
		memory_mb       INTEGER NOT NULL,
		pids            INTEGER NOT NULL,
		timeout_s       INTEGER NOT NULL,
		default_user    TEXT NOT NULL,
		workdir         TEXT NOT NULL DEFAULT '',
		env             TEXT NOT NULL DEFAULT '{}',
		metadata        TEXT NOT NULL DEFAULT '{}',
		idempotency_key TEXT UNIQUE,
		request_hash    TEXT NOT NULL DEFAULT '',
		created_at      INTEGER NOT NULL,
		started_at      INTEGER NOT NULL DEFAULT 0,
		expires_at      INTEGER NOT NULL DEFAULT 0,
		ended_at        INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX sessions_state ON sessions(state);
	CREATE TABLE templates (
		name        TEXT PRIMARY KEY,
		source      TEXT NOT NULL,
		digest      TEXT NOT NULL DEFAULT '',
		size_bytes  INTEGER NOT NULL DEFAULT 0,
		created_at  INTEGER NOT NULL
	);
	CREATE TABLE api_keys (
		id           TEXT PRIMARY KEY,
		hash         TEXT NOT NULL UNIQUE,
		name         TEXT NOT NULL DEFAULT '',
		created_at   INTEGER NOT NULL,
		last_used_at INTEGER NOT NULL DEFAULT 0
	);`,
	// 2: snapshots, pause state, restore source, disk limits, warm pools.
	`ALTER TABLE sessions ADD COLUMN snapshot TEXT NOT NULL DEFAULT '';
	ALTER TABLE sessions ADD COLUMN disk_mb INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sessions ADD COLUMN auto_pause_s INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sessions ADD COLUMN paused_at INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sessions ADD COLUMN remaining_ms INTEGER NOT NULL DEFAULT 0;
	CREATE TABLE snapshots (
		id          TEXT PRIMARY KEY,
		session_id  TEXT NOT NULL,
		parent      TEXT NOT NULL DEFAULT '',
		template    TEXT NOT NULL,
		storage     TEXT NOT NULL,
		size_bytes  INTEGER NOT NULL DEFAULT 0,
		digest      TEXT NOT NULL,
		created_at  INTEGER NOT NULL,
		expires_at  INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX snapshots_parent ON snapshots(parent);
	CREATE INDEX sessions_snapshot ON sessions(snapshot);
	CREATE TABLE pools (
		template   TEXT PRIMARY KEY,
		size       INTEGER NOT NULL,
		cpu        REAL NOT NULL,
		memory_mb  INTEGER NOT NULL,
		pids       INTEGER NOT NULL,
		disk_mb    INTEGER NOT NULL
	);`,
	// 3: whether a paused session was paused by its own auto-pause (it
	// resumes on its next call, also after a daemon restart).
	`ALTER TABLE sessions ADD COLUMN auto_paused INTEGER NOT NULL DEFAULT 0;`,
	// 4: the envd access token a session's E2B clients present, what a
	// session does when its timeout is reached (kill or pause) and whether
	// a session paused that way resumes on its next call; snapshot names.
	`ALTER TABLE sessions ADD COLUMN envd_token TEXT NOT NULL DEFAULT '';
	ALTER TABLE sessions ADD COLUMN on_timeout TEXT NOT NULL DEFAULT '';
	ALTER TABLE sessions ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE snapshots ADD COLUMN name TEXT NOT NULL DEFAULT '';
	CREATE INDEX snapshots_by_name ON snapshots (name, created_at);`,
	// 5: a session's egress policy (JSON, '' for none) and its egress
	// records (kept after the session ends: they are an audit trail).
	`ALTER TABLE sessions ADD COLUMN network TEXT NOT NULL DEFAULT '';
	CREATE TABLE egress (
		seq        INTEGER PRIMARY KEY AUTOINCREMENT,
		session_id TEXT NOT NULL,
		time       INTEGER NOT NULL,
		kind       TEXT NOT NULL,
		host       TEXT NOT NULL,
		addr       TEXT NOT NULL,
		port       INTEGER NOT NULL,
		bytes_up   INTEGER NOT NULL,
		bytes_down INTEGER NOT NULL,
		decision   TEXT NOT NULL,
		reason     TEXT NOT NULL
	);
	CREATE INDEX egress_by_session ON egress (session_id, seq);`,
	// 6: egress records by age, for pruning.
	`CREATE INDEX egress_by_time ON egress (time);`,
	// 7: memory snapshots (gVisor checkpoints): the driver that took one
	// ('' for a files-only snapshot), its sealed image's digest and size.
	`ALTER TABLE snapshots ADD COLUMN memory_driver TEXT NOT NULL DEFAULT '';
	ALTER TABLE snapshots ADD COLUMN memory_digest TEXT NOT NULL DEFAULT '';
	ALTER TABLE snapshots ADD COLUMN memory_bytes INTEGER NOT NULL DEFAULT 0;`,
	// 8: tenants. Every key, session, snapshot and imported template
	// belongs to one (the base template to all: tenant ''); what was there
	// before belongs to "default", whose
	// key (the install's own) is an admin key and whose egress ceiling is
	// open, so a one-user install works as before. Idempotency keys are
	// scoped by tenant ("tenant/key"). A deleted tenant's row stays (its
	// name keeps naming its records, so it is never reused). The audit trail is append-only
	// (triggers refuse updates and deletes); tenant_usage counts CPU per
	// UTC day; sessions.cpu_ms is the CPU already counted for a session.
	`CREATE TABLE tenants (
		name        TEXT PRIMARY KEY,
		policy      TEXT NOT NULL DEFAULT '{}',
		created_at  INTEGER NOT NULL,
		flagged_at  INTEGER NOT NULL DEFAULT 0,
		flag_reason TEXT NOT NULL DEFAULT '',
		deleted_at  INTEGER NOT NULL DEFAULT 0
	);
	INSERT INTO tenants (name, policy, created_at)
		VALUES ('default', '{"egress_allow":["*"]}', CAST(strftime('%s','now') AS INTEGER) * 1000);
	ALTER TABLE api_keys ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
	ALTER TABLE api_keys ADD COLUMN admin INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE api_keys ADD COLUMN revoked_at INTEGER NOT NULL DEFAULT 0;
	UPDATE api_keys SET admin = 1;
	CREATE INDEX api_keys_by_tenant ON api_keys (tenant);
	ALTER TABLE sessions ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
	ALTER TABLE sessions ADD COLUMN cpu_ms INTEGER NOT NULL DEFAULT 0;
	UPDATE sessions SET idempotency_key = 'default/' || idempotency_key WHERE idempotency_key IS NOT NULL;
	CREATE INDEX sessions_by_tenant ON sessions (tenant, state);
	ALTER TABLE snapshots ADD COLUMN tenant TEXT NOT NULL DEFAULT 'default';
	ALTER TABLE templates ADD COLUMN tenant TEXT NOT NULL DEFAULT '';
	UPDATE templates SET tenant = 'default' WHERE name != 'base';
	CREATE TABLE tenant_usage (
		tenant TEXT NOT NULL,
		day    TEXT NOT NULL,
		cpu_ms INTEGER NOT NULL DEFAULT 0,
		PRIMARY KEY (tenant, day)
	);
	CREATE TABLE audit (
		seq             INTEGER PRIMARY KEY AUTOINCREMENT,
		time            INTEGER NOT NULL,
		tenant          TEXT NOT NULL,
		session         TEXT NOT NULL DEFAULT '',
		kind            TEXT NOT NULL,
		outcome         TEXT NOT NULL,
		key_id          TEXT NOT NULL DEFAULT '',
		request_id      TEXT NOT NULL DEFAULT '',
		idempotency_key TEXT NOT NULL DEFAULT '',
		detail          TEXT NOT NULL DEFAULT '{}'
	);
	CREATE INDEX audit_by_tenant ON audit (tenant, seq);
	CREATE INDEX audit_by_tenant_kind ON audit (tenant, kind, seq);
	CREATE INDEX audit_by_session ON audit (session, seq);
	CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
		BEGIN SELECT RAISE(ABORT, 'audit records are append-only'); END;
	CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
		BEGIN SELECT RAISE(ABORT, 'audit records are append-only'); END;`,
	// 10: snapshots made for a fork stay provisional until the fork answers
	// (a daemon restart reclaims those nobody uses).
	`ALTER TABLE snapshots ADD COLUMN provisional INTEGER NOT NULL DEFAULT 0;`,
	// 11: the traffic access token a session's E2B clients present for
	// its services other than envd (the code-execution service); '' for
	// sessions made before, which opens those services to nobody.
	`ALTER TABLE sessions ADD COLUMN traffic_token TEXT NOT NULL DEFAULT '';`,
	// 12: whether the session's ports take requests without a token
	// (public_traffic); 0, private, for every session made before.
	`ALTER TABLE sessions ADD COLUMN public_traffic INTEGER NOT NULL DEFAULT 0;`,
	// 13: tenant secrets for the credential broker; the value only sealed
	// (broker.Seal), hosts a JSON array.
	`CREATE TABLE secrets (
		tenant     TEXT NOT NULL,
		name       TEXT NOT NULL,
		hosts      TEXT NOT NULL,
		header     TEXT NOT NULL DEFAULT '',
		sealed     BLOB NOT NULL,
		created_at INTEGER NOT NULL,
		updated_at INTEGER NOT NULL,
		PRIMARY KEY (tenant, name)
	);`,
	// 14: volumes (a tenant's persistent directories, each a storage
	// layer named layer_id) and the volumes each session mounts (a JSON
	// array of node.VolumeMount; '' for none).
	`CREATE TABLE volumes (
		tenant     TEXT NOT NULL,
		name       TEXT NOT NULL,
		layer_id   TEXT NOT NULL UNIQUE,
		size_mb    INTEGER NOT NULL,
		created_at INTEGER NOT NULL,
		PRIMARY KEY (tenant, name)
	);
	ALTER TABLE sessions ADD COLUMN volumes TEXT NOT NULL DEFAULT '';`,
	// 15: when the snapshot's sealed memory checkpoint was copied to the
	// fleet's object store (0: not copied; package fleet).
	`ALTER TABLE snapshots ADD COLUMN memory_replicated_at INTEGER NOT NULL DEFAULT 0;`,
	// 16: volume snapshots (package volume): a volume's own (session_snapshot
	// '') or one of the volumes a session snapshot captured (with the path
	// it was mounted at; a read-only mount is recorded with read_only 1 and
	// holds no data). A volume's session is the session whose copy it is
	// ('' for a volume the tenant made), destroyed with that session.
	`CREATE TABLE volume_snapshots (
		id               TEXT PRIMARY KEY,
		tenant           TEXT NOT NULL,
		name             TEXT NOT NULL DEFAULT '',
		volume           TEXT NOT NULL,
		size_mb          INTEGER NOT NULL,
		size_bytes       INTEGER NOT NULL,
		session_snapshot TEXT NOT NULL DEFAULT '',
		path             TEXT NOT NULL DEFAULT '',
		read_only        INTEGER NOT NULL DEFAULT 0,
		created_at       INTEGER NOT NULL
	);
	CREATE UNIQUE INDEX volume_snapshots_name ON volume_snapshots (tenant, name) WHERE name != '';
	CREATE INDEX volume_snapshots_session ON volume_snapshots (session_snapshot);
	ALTER TABLE volumes ADD COLUMN session TEXT NOT NULL DEFAULT '';`,
}

// Open opens (creating if needed) the database at path and migrates it to
// the latest schema. It fails if the database is newer than this binary.
//
// The database is readable by root only (0600, and SQLite gives its -wal and
// -shm files the same mode): it holds every session's environment, where
// callers put the secrets their sandboxes need, and the data directory's
// well-known paths are traversable by every host user.
func Open(ctx context.Context, path string) (*Store, error) {
	if err := restrictDBFiles(path); err != nil {
		return nil, err
	}
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	// One connection: SQLite serialises writers anyway, and a single
	// connection makes every transaction see the previous one's writes.
	db.SetMaxOpenConns(1)
	s := &Store{db: db, keyCache: map[string]APIKey{}}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	ro, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(10000)&_pragma=query_only(1)")
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open %s read-only: %w", path, err)
	}
	ro.SetMaxOpenConns(4)
	s.ro = ro
	if s.auditIns, err = s.prepareAuditInsert(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return s, nil
}

// restrictDBFiles creates the database file at path with mode 0600 if it is
// missing, and sets 0600 on it and its -wal and -shm files if they exist.
func restrictDBFiles(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	f.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		if err := os.Chmod(p, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error {
	if s.auditIns != nil {
		s.auditIns.Close()
	}
	s.ro.Close()
	return s.db.Close()
}

// SchemaVersion returns the schema version recorded in the database.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := s.db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v)
	return v, err
}

func (s *Store) migrate(ctx context.Context) error {
	v, err := s.SchemaVersion(ctx)
	if err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if v > len(migrations) {
		return fmt.Errorf("database schema version %d is newer than this forkbox (%d): %w",
			v, len(migrations), errdefs.ErrUnavailable)
	}
	for i := v; i < len(migrations); i++ {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %d: %w", i+1, err)
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", i+1)); err != nil {
			tx.Rollback()
			return fmt.Errorf("migration %d: %w", i+1, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migration %d: %w", i+1, err)
		}
	}
	return nil
}

// isUniqueViolation reports whether err is a SQLite UNIQUE or PRIMARY KEY
// constraint failure.
func isUniqueViolation(err error) bool {
	return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed")
}

// notFound maps sql.ErrNoRows to an ErrNotFound naming what was looked up.
func notFound(err error, what string) error {
	if errors.Is(err, sql.ErrNoRows) {
		return errdefs.Newf(errdefs.ErrNotFound, "%s", what)
	}
	return err
}
