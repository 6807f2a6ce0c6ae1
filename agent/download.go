package agent

import (
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// streamChunk is the read size of a download streamed to EOF, in bytes.
const streamChunk = 64 << 10

// sizeUnknown reports whether the size stat gives for the open regular
// file f is not its length: files of the kernel's pseudo filesystems
// (procfs reports 0 for /proc/PID/environ and mountinfo, sysfs 4096 for
// every attribute, cgroup files 0) are generated when read, and an empty
// file may be one too (a pseudo filesystem this list does not know, or
// gVisor's own). Such a file is read to EOF instead.
func sizeUnknown(f *os.File, size int64) bool {
	if size == 0 {
		return true
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return true
	}
	switch int64(st.Type) {
	case unix.PROC_SUPER_MAGIC, unix.SYSFS_MAGIC, unix.CGROUP_SUPER_MAGIC, unix.CGROUP2_SUPER_MAGIC,
		unix.DEBUGFS_MAGIC, unix.TRACEFS_MAGIC, unix.SECURITYFS_MAGIC, unix.BPF_FS_MAGIC:
		return true
	}
	return false
}

// streamToEOF answers a download of f, whose length is not known in
// advance, by reading it to EOF. A file that ends within the first chunk
// gets its exact Content-Length; a longer one is sent chunked, without
// Range support. The first chunk is read before the answer starts, so a
// file that cannot be read at all (EIO, EACCES) is an ordinary error
// answer; an error later cuts the answer (the client sees a truncated
// transfer, never a short file that looks whole). Memory stays at one
// chunk however long the file is.
func streamToEOF(w http.ResponseWriter, f *os.File) {
	buf := make([]byte, streamChunk)
	n, err := io.ReadFull(f, buf)
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		w.Header().Set("Content-Length", strconv.Itoa(n))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(buf[:n])
		return
	case err != nil:
		writeFileError(w, err)
		return
	}
	w.Header().Del("Content-Length")
	w.WriteHeader(http.StatusOK)
	for {
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return // the client went away
			}
		}
		if errors.Is(err, io.EOF) {
			return
		}
		n, err = f.Read(buf)
		if err != nil && !errors.Is(err, io.EOF) {
			panic(http.ErrAbortHandler)
		}
	}
}
