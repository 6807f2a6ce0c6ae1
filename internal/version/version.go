// Package version reports the build's version, set at link time with
// -ldflags "-X github.com/forkbox/forkbox/internal/version.Version=v1.2.3"
// and otherwise derived from the Go build info (VCS revision).
package version

import "runtime/debug"

// Version is the release version; "dev" for a plain `go build`.
var Version = "dev"

// EnvdVersion is the envd protocol version whose features forkbox-agent
// implements, as reported to E2B SDKs (they switch features on it).
const EnvdVersion = "0.6.13"

// String returns Version plus the VCS revision when known ("dev+3f2a1b9c").
func String() string {
	v := Version
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 8 {
				v += "+" + s.Value[:8]
			}
		}
	}
	return v
}
