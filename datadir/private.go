package datadir

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// EnsurePrivateDir makes directory dir (mode 0700; its parent must
// exist) or accepts the one there only when it is a real directory (not
// a symlink) owned by this process's effective user that no one else
// may enter (no group or other bits). It is for directories of
// plaintext in places anyone may write, such as Scratch in /dev/shm,
// whose name anyone can compute: one made there first by another user
// would let that user rename, replace or plant what is put in it. The
// error names dir.
func EnsurePrivateDir(dir string) error {
	err := os.Mkdir(dir, 0o700)
	if err == nil {
		return nil
	}
	if !errors.Is(err, os.ErrExist) {
		return err
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() || st.Mode&0o077 != 0 {
		return fmt.Errorf("%s is not this daemon's private directory (mode %o, owner %d): remove it and retry", dir, st.Mode, st.Uid)
	}
	return nil
}
