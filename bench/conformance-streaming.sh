#!/bin/bash
# Usage: .venv/bin/python bench/with_containerd.py bench/conformance-streaming.sh  (env TOOLS: the directory
# with crictl-1.36.0, default /work/tools/bin)
# crictl-1.36.0 streaming paths (exec -i, exec -t, attach, logs -f, port-forward), direct and through the
# proxy (frames), each on its own pod; prints one line per path and endpoint: ok/FAIL and what was seen.
set -u
WT=$(cd "$(dirname "$0")/.." && pwd)
TOOLS=${TOOLS:-/work/tools/bin}
C=$TOOLS/crictl-1.36.0
D=$(mktemp -d /tmp/stm-XXXX)
$WT/.venv/bin/cri-proxy serve --config /dev/null --listen unix://$D/p.sock --runtime-endpoint unix://$CONTAINERD_SOCK \
  --state-dir $D/state --kubelet-state-file $D/cms > $D/proxy.log 2>&1 &
PP=$!
for i in $(seq 100); do [ -S $D/p.sock ] && break; sleep 0.1; done
check() { if [ "$2" = 0 ]; then echo "  ok   $1"; else echo "  FAIL $1: $3"; fi; }
for which in direct proxy; do
  if [ $which = direct ]; then EP=unix://$CONTAINERD_SOCK; PORT=18180; else EP=unix://$D/p.sock; PORT=18280; fi
  cc() { $C -r $EP -i $EP "$@" 2>/dev/null; }
  echo "== $which ($EP)"
  cat > $D/pod-$which.json <<J
{"metadata": {"name": "st-$which", "namespace": "default", "uid": "st-$which-$$", "attempt": 0},
 "log_directory": "$D/logs-$which", "linux": {"security_context": {"namespace_options": {"network": 2}}}}
J
  cat > $D/ctr-$which.json <<J
{"metadata": {"name": "tick"}, "image": {"image": "$CONTAINERD_IMAGE"}, "log_path": "tick.log", "stdin": true, "tty": false,
 "command": ["sh", "-c", "httpd -p 127.0.0.1:$PORT -h /etc; i=0; while true; do echo tick \$i; i=\$((i+1)); sleep 0.5; done"]}
J
  POD=$(cc runp $D/pod-$which.json); CID=$(cc create $POD $D/ctr-$which.json $D/pod-$which.json); cc start $CID >/dev/null
  sleep 1
  out=$(echo hello-exec | timeout -k 1 10 $C -r $EP exec -i $CID cat 2>/dev/null); [ "$out" = hello-exec ]; check "exec -i" $? "$out"
  out=$(timeout -k 1 10 script -qec "$C -r $EP exec -it $CID tty 2>/dev/null" /dev/null | tr -d '\r'); echo "$out" | grep -q '^/dev/pts/'; check "exec -t (tty: $out)" $? "$out"
  out=$(timeout -k 1 3 $C -r $EP attach $CID 2>&1); echo "$out" | grep -q tick; check "attach ($(echo "$out" | grep -c tick) lines in 3 s)" $? "$(echo "$out"|tail -2)"
  out=$(timeout -k 1 3 $C -r $EP logs -f $CID 2>&1); echo "$out" | grep -q tick; check "logs -f ($(echo "$out" | grep -c tick) lines in 3 s)" $? "$(echo "$out"|tail -2)"
  LP=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  $C -r $EP port-forward $POD $LP:$PORT > $D/pf-$which.log 2>&1 & PF=$!
  for i in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/$LP) 2>/dev/null && break; sleep 0.1; done
  out=$(python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$LP/passwd', timeout=5).read().decode().splitlines()[0])" 2>&1)
  echo "$out" | grep -q '^root:'; check "port-forward (GET /passwd: $out)" $? "$(cat $D/pf-$which.log | tail -2)"
  kill $PF 2>/dev/null; wait $PF 2>/dev/null
  cc stopp $POD >/dev/null; cc rmp $POD >/dev/null
done
kill $PP; wait $PP
