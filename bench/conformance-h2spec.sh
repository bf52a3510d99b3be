#!/bin/bash
# Usage: /work/tools/with-containerd.py bench/conformance-h2spec.sh   (reference tools in /work/tools, see docs/conformance.md)  NO_GRPC=1 skips the grpc-mode proxy
# Run inside with-containerd.py: starts proxy frames + grpc in front of $CONTAINERD_SOCK, h2spec all three in parallel.
set -u
WT=$(cd "$(dirname "$0")/.." && pwd)
D=$(mktemp -d /tmp/h2m-XXXX)
CLI=$WT/.venv/bin/cri-proxy
start_proxy() { # name mode
  mkdir -p $D/$1
  $CLI serve --config /dev/null --listen unix://$D/$1/p.sock --runtime-endpoint unix://$CONTAINERD_SOCK \
    --state-dir $D/$1/state --kubelet-state-file $D/$1/cpu_manager_state --relay-mode $2 > $D/$1/log 2>&1 &
  echo $! > $D/$1/pid
}
start_proxy frames frames
[ -n "${NO_GRPC:-}" ] || start_proxy grpc grpc
for i in $(seq 200); do [ -S $D/frames/p.sock ] && { [ -n "${NO_GRPC:-}" ] || [ -S $D/grpc/p.sock ]; } && break; sleep 0.1; done
ls -la $D/*/
/work/tools/run-h2spec.sh $CONTAINERD_SOCK m-direct > $D/direct.out 2>&1 &
P1=$!
/work/tools/run-h2spec.sh $D/frames/p.sock m-frames > $D/frames.out 2>&1 &
P2=$!
[ -n "${NO_GRPC:-}" ] || /work/tools/run-h2spec.sh $D/grpc/p.sock m-grpc > $D/grpc.out 2>&1 &
P3=$!
wait $P1 $P2 $P3
cat $D/*.out
for m in frames grpc; do [ -f $D/$m/pid ] && kill $(cat $D/$m/pid); done
sleep 1
tail -n 5 $D/*/log
echo "dir $D"
