#!/usr/bin/env bash
# Starts `forkbox serve` in the background, runs a short demo against it and
# then keeps the daemon in the foreground until Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${DATA_DIR:-/var/lib/forkbox}
LISTEN=${LISTEN:-127.0.0.1:7070}
export FORKBOX_URL="http://$LISTEN"

# The storage volume's space is reserved on the host when it is first made
# (STORAGE_GIB, 16 GiB unless set; forkbox serve alone takes half the free disk).
bin/forkbox serve --data-dir "$DATA_DIR" --listen "$LISTEN" --storage-size "${STORAGE_GIB:-16}" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 100); do
  curl -fs "$FORKBOX_URL/health" >/dev/null 2>&1 && break
  kill -0 $pid 2>/dev/null || { echo "forkbox serve exited" >&2; exit 1; }
  sleep 0.1
done
export FORKBOX_API_KEY=$(cat "$DATA_DIR/api-key")

echo
echo "== forkbox run: Python inside a sandbox (exit status passes through)"
set +e
bin/forkbox --api-key-file "$DATA_DIR/api-key" run -- python3 -c 'import sys, os, socket; print(sys.version.split()[0], "as uid", os.getuid(), "on", socket.gethostname()); sys.exit(3)'
echo "exit status: $?"
set -e

echo
echo "== a session: files in and out, commands, isolation"
id=$(bin/forkbox create --label demo=1)
echo "session $id"
printf 'print(sum(range(10**6)))\n' > /tmp/forkbox-demo.py
bin/forkbox cp /tmp/forkbox-demo.py "$id:/home/user/demo.py"
bin/forkbox exec "$id" -- python3 demo.py
bin/forkbox exec "$id" -- sh -c 'ps -eo pid,user,comm; touch /usr/x 2>&1 || true; ls /etc/shadow 2>&1 || true'
bin/forkbox exec "$id" -- sh -c 'python3 -c "print(\"hello from the sandbox\")" > out.txt'
bin/forkbox cp "$id:/home/user/out.txt" -

echo
echo "== snapshot and fork: prepare once, branch into copies"
bin/forkbox exec "$id" -- sh -c 'echo "prepared at $(date +%T)" > state.txt'
snap=$(bin/forkbox snapshot "$id")
echo "snapshot $snap"
forks=$(bin/forkbox fork --from-snapshot "$snap" -n 3)
for f in $forks; do
  bin/forkbox exec "$f" -- sh -c 'echo "$(hostname): $(cat state.txt)"; echo "only in $(hostname)" > mine.txt'
done
bin/forkbox pause "$id" && bin/forkbox resume "$id"
bin/forkbox ls
bin/forkbox rm $forks >/dev/null
bin/forkbox snapshot rm "$snap" >/dev/null
bin/forkbox rm "$id" >/dev/null
rm -f /tmp/forkbox-demo.py

if command -v runsc >/dev/null 2>&1; then
  echo
  echo "== gVisor: a memory snapshot forks a running program"
  g=$(bin/forkbox create --isolation gvisor)
  bin/forkbox exec "$g" -- sh -c 'nohup python3 -c "
import os, time
n = 0
while True:
    n += 1
    open(\"/tmp/n.tmp\", \"w\").write(str(n))
    os.replace(\"/tmp/n.tmp\", \"/tmp/n\")
    time.sleep(0.1)
" >/dev/null 2>&1 &'
  sleep 1
  echo "counter in $g: $(bin/forkbox exec "$g" -- cat /tmp/n)"
  gsnap=$(bin/forkbox snapshot --with-memory "$g")
  gforks=$(bin/forkbox fork --from-snapshot "$gsnap" -n 2)
  for f in $gforks; do
    bin/forkbox exec "$f" -- sh -c 'echo "$(hostname): counter $(cat /tmp/n) (it kept counting), machine id $(cat /etc/machine-id)"'
  done
  bin/forkbox rm $gforks "$g" >/dev/null
  bin/forkbox snapshot rm "$gsnap" >/dev/null
fi

echo
echo "== tenants: a key per tenant, a policy, an audit trail"
tenant="demo-$$"
bin/forkbox tenant create "$tenant" --max-sessions 2 --max-memory-mb 256 --templates base >/dev/null
tkey=$(bin/forkbox key create --tenant "$tenant" --name demo 2>/dev/null)
t=$(FORKBOX_API_KEY=$tkey bin/forkbox create)
FORKBOX_API_KEY=$tkey bin/forkbox exec "$t" -- python3 -c 'print("tenant", 6*7)'
echo "sessions $tenant sees (its own only):"
FORKBOX_API_KEY=$tkey bin/forkbox ls
set +e
FORKBOX_API_KEY=$tkey bin/forkbox create --memory 1024 2>&1 | head -1
set -e
FORKBOX_API_KEY=$tkey bin/forkbox rm "$t" >/dev/null
FORKBOX_API_KEY=$tkey bin/forkbox audit
bin/forkbox tenant ls
bin/forkbox tenant rm --force "$tenant" >/dev/null

echo
echo "forkbox is serving at $FORKBOX_URL (API key in $DATA_DIR/api-key). Ctrl-C stops it."
echo "Try:  export FORKBOX_API_KEY=\$(cat $DATA_DIR/api-key); bin/forkbox run -- python3 -c 'print(42)'"
wait $pid
