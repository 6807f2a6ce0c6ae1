#!/usr/bin/env bash
# Installs the system packages forkbox needs on Debian 12 (bookworm), as root.
# Idempotent: packages already present are skipped quickly.
#   runc            the container runtime of the runc isolation tier
#   runsc           gVisor, the gvisor isolation tier, from bookworm-backports
#                   (0.0~20240729: bookworm's own 2022 runsc lacks systrap and
#                   the checkpoint features memory snapshots use); the
#                   fallback of the pinned 2026 runsc built below from Go
#                   (FORKBOX_RUNSC_BUILD=0 skips that build)
#   iproute2        ip(8), used by tests to build network namespaces
#   util-linux      unshare(1): the daemon makes each sandbox's user namespace
#                   as the sandbox's own host ids with it
#   podman          peer baseline in `forkbox bench` (run side by side)
#   busybox-static  a static busybox for the benchmark's peer root filesystem
#   xfsprogs        mkfs.xfs, for the overlay storage driver's XFS volume
#   btrfs-progs     mkfs.btrfs, to format the btrfs storage driver's image once
#   nodejs, npm     run the e2b JS SDK compatibility suite (compat/e2b); the
#                   SDK needs Node.js 20.18.1+ (bookworm's own nodejs is 18:
#                   install 20+ from NodeSource first on such a host)
#   protobuf-compiler  only for `make generate` (generated code is committed)
#   python3-ipykernel python3-jupyter-client python3-numpy python3-pandas
#   python3-matplotlib python3-scipy python3-venv python3-pip ca-certificates
#                   what sandboxes of the base template (and its alias
#                   code-interpreter-v1) run code with: they see the host's
#                   /usr read-only, and the base template copies the host's
#                   CA certificates into its /etc
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: run as root (forkbox runs sandboxes with namespaces and cgroups)" >&2
  exit 1
fi

need=()
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v unshare >/dev/null 2>&1 || need+=(util-linux)
command -v podman >/dev/null 2>&1 || need+=(podman)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v mkfs.xfs >/dev/null 2>&1 || need+=(xfsprogs)
command -v mkfs.btrfs >/dev/null 2>&1 || need+=(btrfs-progs)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
for p in python3-ipykernel python3-jupyter-client python3-numpy python3-pandas \
  python3-matplotlib python3-scipy python3-venv python3-pip ca-certificates; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || need+=("$p")
done
if [ "${FORKBOX_GENERATE:-0}" = 1 ]; then
  command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
fi

if [ ${#need[@]} -gt 0 ]; then
  echo "install-deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# gVisor: the backports suite is added when missing; an older runsc (from
# bookworm itself) is replaced.
runsc_ok() {
  command -v runsc >/dev/null 2>&1 || return 1
  local v
  v=$(runsc --version 2>/dev/null | sed -n 's/^runsc version 0\.0~\([0-9]\{8\}\).*/\1/p')
  [ -n "$v" ] && [ "$v" -ge 20240729 ]
}
if ! runsc_ok; then
  if ! grep -rqsE '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    echo "install-deps: adding the bookworm-backports suite for runsc"
    cat >/etc/apt/sources.list.d/bookworm-backports.sources <<'SOURCES'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
  fi
  echo "install-deps: installing runsc from bookworm-backports"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends -t bookworm-backports runsc >/dev/null
  runsc_ok || { echo "install-deps: runsc from bookworm-backports is missing or too old" >&2; exit 1; }
fi

if ! command -v go >/dev/null 2>&1 && [ ! -x /usr/local/go/bin/go ]; then
  echo "install-deps: Go is missing; install Go 1.26 into /usr/local/go" >&2
  exit 1
fi

# The default runsc: gVisor's Go branch at a pinned commit, built from the Go
# module proxy once (about 3 minutes on 2 cores) into its own versioned
# directory, with the stable name the daemon looks for first pointing at it.
# It checkpoints and deletes several times faster than the 2024 package and
# restores with O_DIRECT reads. The version is stamped into the binary:
# runsc refuses a checkpoint taken by another version, and an unstamped
# build would pass that check against any other unstamped build. When the
# build fails the backports runsc installed above stays the one in use.
RUNSC_MODULE_VERSION=v0.0.0-20260905035102-160fafc42237
RUNSC_DIR=/usr/local/lib/forkbox
runsc_pinned="$RUNSC_DIR/runsc-${RUNSC_MODULE_VERSION#v}/runsc"
if [ "${FORKBOX_RUNSC_BUILD:-1}" = 1 ] && [ ! -x "$runsc_pinned" ]; then
  echo "install-deps: building runsc ${RUNSC_MODULE_VERSION} from gvisor.dev/gvisor"
  gobin=$(command -v go || echo /usr/local/go/bin/go)
  tmp=$(mktemp -d)
  started=$(date +%s)
  if (cd "$tmp" && CGO_ENABLED=0 GOBIN="$tmp/bin" GOFLAGS=-buildvcs=false "$gobin" install \
      -ldflags "-X gvisor.dev/gvisor/runsc/version.version=${RUNSC_MODULE_VERSION#v}" \
      "gvisor.dev/gvisor/runsc@${RUNSC_MODULE_VERSION}") >"$tmp/build.log" 2>&1 &&
     "$tmp/bin/runsc" --version 2>/dev/null | grep -qF "${RUNSC_MODULE_VERSION#v}"; then
    mkdir -p "$(dirname "$runsc_pinned")"
    install -m 0755 "$tmp/bin/runsc" "$runsc_pinned.new"
    mv -f "$runsc_pinned.new" "$runsc_pinned"
    echo "install-deps: runsc ${RUNSC_MODULE_VERSION} built in $(( $(date +%s) - started )) s"
  else
    echo "install-deps: building runsc ${RUNSC_MODULE_VERSION} failed; gVisor keeps the backports runsc ($(tail -3 "$tmp/build.log" | tr '\n' ' '))" >&2
  fi
  rm -rf "$tmp"
fi
if [ -x "$runsc_pinned" ]; then
  ln -sfn "runsc-${RUNSC_MODULE_VERSION#v}/runsc" "$RUNSC_DIR/runsc"
fi
if ! node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&b>=18)?0:1)'; then
  echo "install-deps: Node.js $(node --version) is too old for the e2b SDK suite (compat/e2b); install Node.js 20.18+" >&2
  exit 1
fi
runsc_default=runsc
[ -x "$RUNSC_DIR/runsc" ] && runsc_default="$RUNSC_DIR/runsc"
echo "install-deps: ok ($(runc --version | head -1); $("$runsc_default" --version | head -1); node $(node --version))"
