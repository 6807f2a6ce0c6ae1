package store

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDatabaseFilesPrivate: the database (and its WAL and shared-memory
// files) holds session environments, often secrets; it must be readable by
// its owner only, also when an older forkbox left it world-readable.
func TestDatabaseFilesPrivate(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "forkbox.db")
	check := func(when string) {
		t.Helper()
		for _, p := range []string{path, path + "-wal", path + "-shm"} {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			if fi.Mode().Perm() != 0o600 {
				t.Errorf("%s: %s has mode %v, want 0600", when, filepath.Base(p), fi.Mode().Perm())
			}
		}
	}
	s, err := Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSession(context.Background(), session("s1", time.Now())); err != nil {
		t.Fatal(err)
	}
	check("new database")
	s.Close()
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		_ = os.Chmod(p, 0o644) // as an older forkbox left them
	}
	s, err = Open(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CreateSession(context.Background(), session("s2", time.Now())); err != nil {
		t.Fatal(err)
	}
	check("reopened database")
}
