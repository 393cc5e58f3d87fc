#!/bin/bash
# Stress of a live QEMU session where two threads run the same function under GDB's `finish`
# and `next` (their breakpoints sit at return addresses, reached through `ret`): N sessions of
#   break hit / continue / finish / next x6 / info threads / monitor stats / delete / continue
# on `mt_threads hits`, each counted as failed when GDB or ptrewind says the session broke
# (two threads in QEMU's gdbstub at once). Not a test: the failure is a race (2 of 60 sessions
# on the build before returns claimed the stub); see docs/qemu-gdbstub.md "returns claim too".
#
# usage: examples/stress_qemu_finish.sh PTREWIND [N]
#   PTREWIND: a ptrewind binary with libptrewind_qemu_plugin.so beside it (copy both out of
#   target/release first when building meanwhile); N: sessions (default 60).
set -u
bin=${1:?usage: $0 PTREWIND [N]}
n=${2:-60}
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
# The failed sessions' outputs are kept (in the same private directory), the rest removed.
trap '[ "$failed" -eq 0 ] && rm -rf "$work"' EXIT
failed=0
gcc -g -O0 -pthread -o "$work/mt" "$here/c/mt_threads.c" || exit 2
for i in $(seq 1 "$n"); do
  "$bin" record --backend qemu --listen 127.0.0.1:0 --no-stop-at-exit --once -- "$work/mt" hits \
    > "$work/server.out" 2>&1 &
  server=$!
  for _ in $(seq 300); do grep -q "listening on" "$work/server.out" && break; sleep 0.1; done
  addr=$(grep -o "listening on [0-9.:]*" "$work/server.out" | awk '{print $3}')
  timeout 300 gdb -nx -batch -ex "target remote $addr" -ex "break hit" -ex "continue" \
    -ex "finish" -ex "next" -ex "next" -ex "next" -ex "next" -ex "next" -ex "next" \
    -ex "info threads" -ex "monitor stats" -ex "delete" -ex "continue" "$work/mt" \
    > "$work/gdb.out" 2>&1
  wait "$server"
  if grep -q "at the same time\|Remote connection closed\|internal-error\|Ignoring packet error\|no longer writable" \
    "$work/gdb.out" "$work/server.out"; then
    failed=$((failed + 1))
    cp "$work/gdb.out" "$work/failed-$i.gdb.txt"
    cp "$work/server.out" "$work/failed-$i.server.txt"
  fi
done
echo "$failed of $n sessions failed"
[ "$failed" -eq 0 ] || echo "their GDB and ptrewind outputs: $work/failed-*"
