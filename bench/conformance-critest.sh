#!/bin/bash
# Usage: .venv/bin/python bench/with_containerd.py --registry bench/conformance-critest.sh  (env OUT, MODES, VERSIONS, CRITEST_ARGS,
# TOOLS: the directory with crictl-1.36.0 and critest-<version> built from cri-tools, default /work/tools/bin)
# Inside with-containerd.py: CNI (bridge crimeas0 + loopback) for the private containerd, proxy (frames) in front,
# critest 1.36.0 and 1.26.1 direct and via proxy, junit reports to $OUT. `--registry`: the images critest pulls are
# served by a local registry (tests/e2e/registry.py, busybox stand-ins); without it every spec that pulls fails.
# Needs Debian's containernetworking-plugins (/usr/lib/cni) for the pods' network.
set -u
WT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/measure/critest}
MODES=${MODES:-frames}
VERSIONS=${VERSIONS:-1.36.0 1.26.1}
mkdir -p $OUT
W=$(dirname $CONTAINERD_SOCK)
for b in /usr/lib/cni/*; do ln -sf $b $W/cni/bin/; done
cat > $W/cni/conf/10-measure.conflist <<JSON
{"cniVersion": "0.4.0", "name": "measure", "plugins": [
  {"type": "bridge", "bridge": "crimeas0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.231.77.0/24"}]], "dataDir": "$W/cni/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}, "snat": false}
]}
JSON
TOOLS=${TOOLS:-/work/tools/bin}
C=$TOOLS/crictl-1.36.0
for i in $(seq 100); do $C -r unix://$CONTAINERD_SOCK info 2>/dev/null | grep -A3 '"type": "NetworkReady"' | grep -q '"status": true' && break; sleep 0.2; done
$C -r unix://$CONTAINERD_SOCK info 2>/dev/null | grep -A3 NetworkReady
D=$(mktemp -d /tmp/ctm-XXXX)
declare -A EP
EP[direct]=unix://$CONTAINERD_SOCK
for m in $MODES; do
  mkdir -p $D/$m
  $WT/.venv/bin/cri-proxy serve --config /dev/null --listen unix://$D/$m/p.sock --runtime-endpoint unix://$CONTAINERD_SOCK \
    --state-dir $D/$m/state --kubelet-state-file $D/$m/cpu_manager_state --relay-mode $m > $OUT/proxy-$m.log 2>&1 &
  echo $! > $D/$m/pid
  for i in $(seq 100); do [ -S $D/$m/p.sock ] && break; sleep 0.1; done
  EP[$m]=unix://$D/$m/p.sock
done
for v in $VERSIONS; do
  for t in direct $MODES; do
    echo "=== critest $v $t $(date -u +%T)"
    $TOOLS/critest-$v --runtime-endpoint ${EP[$t]} --image-endpoint ${EP[$t]} --ginkgo.no-color \
      --ginkgo.junit-report $OUT/critest-$v-$t.xml ${CRITEST_ARGS:-} > $OUT/critest-$v-$t.txt 2>&1
    echo "rc=$? $(date -u +%T)"; grep -E '^(Ran|FAIL|PASS|SUCCESS)' $OUT/critest-$v-$t.txt | tail -3
  done
done
if [ -n "${STREAM:-}" ]; then bash $STREAM "${EP[direct]}" "${EP[frames]}"; fi
for m in $MODES; do kill $(cat $D/$m/pid); done
sleep 1
rm -rf $D  # the proxies' state dirs and sockets (logs and reports are in $OUT)
