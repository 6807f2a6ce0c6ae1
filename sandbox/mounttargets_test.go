package sandbox

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/forkbox/forkbox/errdefs"
	"github.com/forkbox/forkbox/node"
	"github.com/forkbox/forkbox/runtime"
	"github.com/forkbox/forkbox/storage"
)

// TestCheckMountTargets proves a root filesystem of an imported template
// whose etc or mount targets are a symlink, directory or FIFO is refused
// with a field error naming the template and the path, a sound or sparse
// one passes, and the built-in template is never checked.
func TestCheckMountTargets(t *testing.T) {
	tpl := &storage.Template{Name: "old-import", Source: "upload"}
	sound := t.TempDir()
	os.Mkdir(filepath.Join(sound, "etc"), 0o755)
	os.WriteFile(filepath.Join(sound, "etc", "hosts"), nil, 0o644)
	if err := checkMountTargets(sound, tpl); err != nil {
		t.Errorf("a sound rootfs: %v", err)
	}
	if err := checkMountTargets(t.TempDir(), tpl); err != nil {
		t.Errorf("a rootfs without etc: %v", err)
	}
	for want, build := range map[string]func(root string){
		"/etc is a symlink":             func(r string) { os.Symlink("/proc/self", filepath.Join(r, "etc")) },
		"/etc/hosts is a symlink":       func(r string) { os.Symlink("/proc/self/environ", filepath.Join(r, "etc", "hosts")) },
		"/etc/hostname is a directory":  func(r string) { os.Mkdir(filepath.Join(r, "etc", "hostname"), 0o755) },
		"/etc/machine-id is a special":  func(r string) { syscall.Mkfifo(filepath.Join(r, "etc", "machine-id"), 0o644) },
		"/etc/resolv.conf is a symlink": func(r string) { os.Symlink("../run/x", filepath.Join(r, "etc", "resolv.conf")) },
	} {
		root := t.TempDir()
		if !strings.HasPrefix(want, "/etc is") {
			os.Mkdir(filepath.Join(root, "etc"), 0o755)
		}
		build(root)
		err := checkMountTargets(root, tpl)
		if errdefs.Field(err) != "template" || !strings.Contains(err.Error(), `"old-import"`) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want a template field error saying so", want, err)
		}
		if err := checkMountTargets(root, &storage.Template{Name: "base", Source: "builtin"}); err != nil {
			t.Errorf("%s: the built-in template was checked: %v", want, err)
		}
	}
}

// TestTemplateMountError proves a runtime's mount failure is a field error
// naming an imported template, and stays as it is for the built-in one.
func TestTemplateMountError(t *testing.T) {
	me := &runtime.MountError{Target: "/etc/hosts", Err: errdefs.Newf(errdefs.ErrInternal, "runc run x")}
	err := templateMountError(me, &storage.Template{Name: "old-import", Source: "upload"})
	if errdefs.Field(err) != "template" || !strings.Contains(err.Error(), "/etc/hosts") {
		t.Errorf("imported: %v", err)
	}
	if err := templateMountError(me, &storage.Template{Name: "base", Source: "builtin"}); !errors.Is(err, errdefs.ErrInternal) {
		t.Errorf("built-in: %v, want it unchanged", err)
	}
}

// TestCheckVolumeTargets proves a volume mount target reached through a
// symlink or a file in the root filesystem is refused naming its
// volumes[i].path, and real or missing directories pass.
func TestCheckVolumeTargets(t *testing.T) {
	root := t.TempDir()
	os.MkdirAll(filepath.Join(root, "home", "user", "real"), 0o755)
	os.Symlink("/etc", filepath.Join(root, "home", "user", "data"))
	os.WriteFile(filepath.Join(root, "home", "user", "file"), nil, 0o644)
	for p, bad := range map[string]bool{
		"/home/user/real": false, "/home/user/real/new/deeper": false, "/mnt/none": false,
		"/home/user/data": true, "/home/user/data/x": true, "/home/user/file": true, "/home/user/file/x": true,
	} {
		err := checkVolumeTargets(root, []node.VolumeMount{{Name: "ok", Path: "/mnt/a"}, {Name: "v", Path: p}})
		if bad && errdefs.Field(err) != "volumes[1].path" {
			t.Errorf("%s: %v, want a volumes[1].path error", p, err)
		}
		if !bad && err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
}
