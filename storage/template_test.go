package storage

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestPrepareMountTargets proves that the files every sandbox mounts over
// become empty regular files owned by the sandbox's root when an image
// made them a symlink (into /proc, or out of the rootfs), a directory
// with contents or a FIFO, or left them out; that an etc which is a
// symlink becomes a real directory (the link's target is untouched); and
// that regular files keep their content.
func TestPrepareMountTargets(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (it chowns to the sandbox id range)")
	}
	shift := DefaultIDShift
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim")
	os.WriteFile(victim, []byte("host file"), 0o644)

	root := t.TempDir()
	etc := filepath.Join(root, "etc")
	os.Mkdir(etc, 0o755)
	os.Symlink("/proc/self/environ", filepath.Join(etc, "hosts"))
	os.MkdirAll(filepath.Join(etc, "hostname", "deep", "er"), 0o755)
	syscall.Mkfifo(filepath.Join(etc, "machine-id"), 0o644)
	os.WriteFile(filepath.Join(etc, "resolv.conf"), []byte("nameserver 192.0.2.1\n"), 0o644)
	if err := PrepareMountTargets(root, shift); err != nil {
		t.Fatal(err)
	}
	for _, rel := range MountTargets {
		p := filepath.Join(root, rel)
		fi, err := os.Lstat(p)
		if err != nil || !fi.Mode().IsRegular() {
			t.Errorf("%s: %v %v, want a regular file", rel, fi.Mode(), err)
			continue
		}
		if rel == "etc/resolv.conf" {
			continue // the image's own file, kept as it was
		}
		st := fi.Sys().(*syscall.Stat_t)
		if int(st.Uid) != shift.UID(RootUID) || int(st.Gid) != shift.GID(RootUID) {
			t.Errorf("%s: owned by %d:%d", rel, st.Uid, st.Gid)
		}
		if fi.Size() != 0 {
			t.Errorf("%s: %d bytes, want an empty file", rel, fi.Size())
		}
	}
	if b, _ := os.ReadFile(filepath.Join(etc, "resolv.conf")); string(b) != "nameserver 192.0.2.1\n" {
		t.Errorf("a regular resolv.conf lost its content: %q", b)
	}

	// etc itself a symlink out of the rootfs, and a target symlinked to a host file.
	root2 := t.TempDir()
	os.Symlink(outside, filepath.Join(root2, "etc"))
	os.Symlink(victim, filepath.Join(outside, "hosts"))
	if err := PrepareMountTargets(root2, shift); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(filepath.Join(root2, "etc")); err != nil || !fi.IsDir() {
		t.Fatalf("etc: %v %v, want a directory", fi.Mode(), err)
	}
	if b, _ := os.ReadFile(victim); string(b) != "host file" {
		t.Fatalf("a file outside the rootfs changed: %q", b)
	}
	if _, err := os.Lstat(filepath.Join(outside, "hosts")); err != nil {
		t.Fatalf("the link outside the rootfs was removed: %v", err)
	}
	if fi, err := os.Lstat(filepath.Join(root2, "etc", "hosts")); err != nil || !fi.Mode().IsRegular() {
		t.Fatalf("etc/hosts: %v %v", fi.Mode(), err)
	}
}

// TestTemplateHostMountsFormat proves template.json's host mounts keep
// the field names data directories already hold: a file written before
// the mount type moved out of the runtime package loads unchanged.
func TestTemplateHostMountsFormat(t *testing.T) {
	dir := t.TempDir()
	old := `{"name":"base","source":"builtin","host_mounts":[{"source":"/usr","target":"/usr","read_only":true}],"size_bytes":0,"version":3,"created_at":"2026-01-01T00:00:00Z"}`
	if err := os.WriteFile(filepath.Join(dir, "template.json"), []byte(old), 0o644); err != nil {
		t.Fatal(err)
	}
	tpl, err := LoadTemplate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(tpl.HostMounts) != 1 || tpl.HostMounts[0].Source != "/usr" || tpl.HostMounts[0].Target != "/usr" || !tpl.HostMounts[0].ReadOnly {
		t.Fatalf("host mounts %+v", tpl.HostMounts)
	}
}
