#!/usr/bin/env bash
# Run a bench against an S3 store at the far end of a slower link: a SeaweedFS in a network
# namespace of its own, reached over a veth pair whose both ends a tc token bucket (tbf)
# holds to RATE. The bench gets S3_ENDPOINT_URL (and the outbound allowance for it).
# Only the rate is shaped: the round trip stays a veth's (tens of microseconds), so what
# costs requests rather than bytes looks cheaper here than over a real long link.
# Needs root (ip netns, tc); everything it makes is removed on exit.
#
#   bash bench/remote_link.sh 200mbit .venv/bin/python bench/pieces.py
#   bash bench/remote_link.sh 1gbit .venv/bin/python bench/replicate.py --shape hf8
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 RATE COMMAND..." >&2; exit 2; }
rate=$1
shift
ns=lifeboat-far near=lbfar0 far=lbfar1 here=10.231.0.1 there=10.231.0.2
weed=$(dirname "$0")/../.venv/bin/weed
data=""

cleanup() {
  # Whatever runs in the namespace, then anything left there after 5 s.
  ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
  for _ in 1 2 3 4 5; do
    [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
    sleep 1
  done
  ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip link del "$near" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  [ -z "$data" ] || { cp "$data/weed.log" /tmp/remote_link_weed.log 2>/dev/null; rm -rf "$data"; }
}
trap cleanup EXIT
cleanup  # what an interrupted run left
data=$(mktemp -d)

ip netns add "$ns"
ip link add "$near" type veth peer name "$far"
ip link set "$far" netns "$ns"
ip addr add "$here/30" dev "$near"
ip link set "$near" up
ip netns exec "$ns" ip addr add "$there/30" dev "$far"
ip netns exec "$ns" ip link set "$far" up
ip netns exec "$ns" ip link set lo up
# A queue long enough that the rate, not drops, is what limits a transfer.
shape=(root tbf rate "$rate" burst 1mbit latency 200ms)
tc qdisc add dev "$near" "${shape[@]}"
ip netns exec "$ns" tc qdisc add dev "$far" "${shape[@]}"

ip netns exec "$ns" "$weed" mini -dir="$data" -ip="$there" -ip.bind="$there" -webdav=false \
  > "$data/weed.log" 2>&1 &
for i in $(seq 60); do
  curl -s -o /dev/null "http://$there:8333" && break
  [ "$i" -lt 60 ] || { cat "$data/weed.log" >&2; echo "no S3 after 60 s" >&2; exit 1; }
  sleep 1
done
echo "S3 at http://$there:8333 over $rate" >&2
S3_ENDPOINT_URL="http://$there:8333" LIFEBOAT_OUTBOUND_ALLOW="$there:8333" "$@"
