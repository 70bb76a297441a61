# shellcheck shell=bash
# chaos-daemon for the local stack (component chaos-daemon): Chaos Mesh's node
# agent, which injects the faults the apiserver alone cannot (NetworkChaos,
# StressChaos, TimeChaos, container-kill), run as root on the host beside the
# real node's containerd, the way its DaemonSet runs it on a cluster's node:
# the runtime socket and namespace, the host's /proc and /sys, mutual TLS with
# chaos-controller-manager, and a `chaos-daemon-*` EndpointSlice naming the
# node, by which the controller finds it.
#
# Built from the same Chaos Mesh source as the controller (chaos-mesh.sh),
# with the helper programs its image carries, each from the first source
# found: CHAOS_HELPERS_SOURCE (a folder of the archives), then
# ../shared/chaos-mesh/helpers/ beside the clone, then the upstream release
# archive checked against its pinned tar-stream sha256:
#   nsexec + libnsenter.so  run tc, iptables, ipset inside a pod's namespaces
#   memStress               StressChaos memory stressors
#   pause                   Chaos Mesh's hack/pause.c, which holds a stressor
#                           until it is moved into the target's cgroup
# toda (IOChaos) and chaos-tproxy (HTTPChaos) are not built: no drill uses
# those kinds.
#
# The daemon runs its helpers from fixed paths (/usr/local/bin/nsexec,
# /usr/local/lib/libnsenter.so ...). Rather than write into the host's
# /usr/local, it runs in a mount namespace of its own where the built folder
# is bind-mounted there, and the host's /sys at /host-sys (the DaemonSet's
# mount, where it finds cgroups); everything else (/proc, /sys, the sockets)
# is the host's. Sourced by e2e/local/stack.

CHAOS_DAEMON_GRPC_PORT=20282
CHAOS_DAEMON_HTTP_PORT=20283
# The name Chaos Mesh's client expects on the daemon's certificate.
CHAOS_DAEMON_SERVER_NAME=chaos-daemon.chaos-mesh.org
# What the daemon shells out to, from Debian; kept apart from the node's
# packages so a stack without drills does not need them.
CHAOS_DAEMON_DEBIAN_PACKAGES=(iproute2 iptables ipset stress-ng util-linux procps gcc libc6-dev)

# name version commit tar-stream-sha256, one helper per line; the archives
# are GitHub's of the tags (git archive --prefix=<name>-<version>/).
CHAOS_HELPERS="nsexec 0.1.6 e056fe8fe22291081606a7a8c2854c4dbdc3a936 f129778a71cfd135cf4b03b664e1525f78e3760bd85f63af69bd0d2fba28952a
memStress 0.3 6583ea9aa7302c2a65ad8704dd3d8665379df6b0 6d1bc16a590c58ac4467ee3c49d8b8893787f59b9c72b4701e9d92f3a5bc5f8c"
CHAOS_HELPERS_SHARED="$(cd "$ROOT/.." && pwd)/shared/chaos-mesh/helpers"

# helper_field NAME COLUMN: a column of a helper's line in CHAOS_HELPERS.
helper_field() { awk -v n="$1" -v c="$2" '$1 == n { print $c }' <<<"$CHAOS_HELPERS"; }

# helper_archive NAME: the path of the helper's archive, fetched and checked
# if no local copy is given; dies naming the three ways to provide it.
helper_archive() {
  local name=$1 version sha file out
  version=$(helper_field "$name" 2) sha=$(helper_field "$name" 4)
  file="$name-v$version.tar.gz"
  if [ -n "${CHAOS_HELPERS_SOURCE:-}" ]; then
    [ -f "$CHAOS_HELPERS_SOURCE/$file" ] || die "CHAOS_HELPERS_SOURCE=$CHAOS_HELPERS_SOURCE has no $file"
    echo "$CHAOS_HELPERS_SOURCE/$file"
    return 0
  fi
  if [ -f "$CHAOS_HELPERS_SHARED/$file" ]; then
    [ "$(tar_stream_sha256 "$CHAOS_HELPERS_SHARED/$file")" = "$sha" ] \
      || die "$CHAOS_HELPERS_SHARED/$file is not $name v$version (its tar stream's sha256 differs from $sha)"
    echo "$CHAOS_HELPERS_SHARED/$file"
    return 0
  fi
  out="$CACHE/downloads/$file"
  if [ ! -f "$out" ]; then
    local url="https://github.com/chaos-mesh/$name/archive/refs/tags/v$version.tar.gz" tmp
    mkdir -p "$CACHE/downloads"
    tmp=$(mktemp "$out.XXXXXX")
    log "fetching $name v$version from $url"
    curl -fsSL --retry 2 --connect-timeout 20 -o "$tmp" "$url" || { rm -f "$tmp"; die "$name v$version not found. Provide it in one of three ways:
  1. CHAOS_HELPERS_SOURCE=<folder holding $file>
  2. place $file (git archive of tag v$version) in $CHAOS_HELPERS_SHARED
  3. allow the download of $url (it failed just now)"; }
    [ "$(tar_stream_sha256 "$tmp")" = "$sha" ] || { rm -f "$tmp"; die "the download of $url is not $name v$version"; }
    mv "$tmp" "$out"
  fi
  echo "$out"
}

# The built daemon and helpers, keyed by every input: the Chaos Mesh source,
# the helper archives, and the Go and Rust toolchains.
chaos_daemon_dir() {
  chaos_mesh_resolve
  local key
  key=$( (echo "$CHAOS_MESH_KEY"; echo "$CHAOS_HELPERS"; go env GOVERSION; rustc --version) | sha256sum | cut -c1-12)
  echo "$CACHE/bin/chaos-daemon-$key"
}

install_chaos-daemon() {
  install_debian_packages "${CHAOS_DAEMON_DEBIAN_PACKAGES[@]}"
  command -v go >/dev/null || die "Go is needed to build chaos-daemon (Go >= 1.26)"
  command -v cargo >/dev/null || die "Rust (cargo) is needed to build nsexec"
  chaos_mesh_resolve
  local out; out=$(chaos_daemon_dir)
  [ -f "$out/.complete" ] && return 0
  local src=$CHAOS_MESH_SRC tmp work
  mkdir -p "$CACHE/bin"
  tmp=$(mktemp -d "$CACHE/bin/.chaos-daemon-XXXXXX")
  mkdir -p "$tmp/bin" "$tmp/lib"
  work="$tmp/work"
  mkdir -p "$work"
  log "building chaos-daemon and its helpers; the first build takes minutes, later ones are cached"
  # TimeChaos's fake clock is two objects the daemon embeds, and its ptrace
  # code is cgo: built as Chaos Mesh's Makefile builds them.
  cp -r "$src" "$work/chaos-mesh"
  ( cd "$work/chaos-mesh" &&
    cc -c pkg/time/fakeclock/fake_clock_gettime.c -fPIE -O2 -o pkg/time/fakeclock/fake_clock_gettime.o &&
    cc -c pkg/time/fakeclock/fake_gettimeofday.c -fPIE -O2 -o pkg/time/fakeclock/fake_gettimeofday.o &&
    cc hack/pause.c -o "$tmp/bin/pause" &&
    CGO_ENABLED=1 go build -ldflags "$(chaos_mesh_version_ldflags)" -o "$tmp/bin/chaos-daemon" ./cmd/chaos-daemon ) \
    || { rm -rf "$tmp"; die "building chaos-daemon failed"; }
  # nsexec pins a 2020 nightly in rust-toolchain; it builds on stable.
  tar -xzf "$(helper_archive nsexec)" -C "$work" --no-same-owner
  ( cd "$work/nsexec-$(helper_field nsexec 2)" && rm -f rust-toolchain &&
    CARGO_TARGET_DIR="$work/nsexec-target" cargo build --release --workspace --quiet &&
    cp "$work/nsexec-target/release/nsexec" "$tmp/bin/" &&
    cp "$work/nsexec-target/release/libnsenter.so" "$tmp/lib/" ) \
    || { rm -rf "$tmp"; die "building nsexec failed"; }
  tar -xzf "$(helper_archive memStress)" -C "$work" --no-same-owner
  ( cd "$work/memStress-$(helper_field memStress 2)" && GOFLAGS=-mod=mod go build -o "$tmp/bin/memStress" . ) \
    || { rm -rf "$tmp"; die "building memStress failed"; }
  rm -rf "$work"
  touch "$tmp/.complete"
  rm -rf "$out"
  mv "$tmp" "$out"
}

# --- certificates ---------------------------------------------------------------

chaos_pki() { echo "$STATE/chaos-mesh/pki"; }

# A CA of its own (as Chaos Mesh's chart makes), the daemon's server pair
# and the controller's client pair. Made once per state folder.
chaos_daemon_certs() {
  local d; d=$(chaos_pki)
  [ -f "$d/client.crt" ] && return 0
  mkdir -p "$d"
  ( cd "$d" &&
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=flashsale-stack chaos CA" \
      -keyout ca.key -out ca.crt 2>/dev/null &&
    chaos_issue server "/CN=$CHAOS_DAEMON_SERVER_NAME" \
      "subjectAltName=DNS:$CHAOS_DAEMON_SERVER_NAME
extendedKeyUsage=serverAuth" &&
    chaos_issue client "/CN=chaos-controller-manager" "extendedKeyUsage=clientAuth" ) \
    || die "creating the chaos-daemon certificates in $d failed"
}

# chaos_issue NAME SUBJECT EXTENSIONS, in the PKI folder.
chaos_issue() {
  openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null &&
    printf '%s\n' "$3" >"$1.ext" &&
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" -days 3650 \
      -extfile "$1.ext" 2>/dev/null &&
    rm -f "$1.csr" "$1.ext"
}

# The controller's environment for talking to the daemon over mutual TLS.
chaos_daemon_client_env() {
  local d; d=$(chaos_pki)
  echo "CHAOS_MESH_CA_CERT=$d/ca.crt CHAOS_DAEMON_CLIENT_CERT=$d/client.crt" \
    "CHAOS_DAEMON_CLIENT_KEY=$d/client.key CHAOS_DAEMON_SERVICE_PORT=$CHAOS_DAEMON_GRPC_PORT"
}

# --- the process -----------------------------------------------------------------

up_chaos-daemon() {
  chaos_daemon_certs
  chaos_mesh_namespace
  local dir d; dir=$(chaos_daemon_dir) d=$(chaos_pki)
  mkdir -p "$STATE/chaos-daemon"
  # The launcher is named like the daemon, so the stack's liveness check
  # recognises the process before and after the exec.
  local launch="$STATE/chaos-daemon/chaos-daemon"
  cat >"$launch" <<EOF
#!/bin/sh
# Written by e2e/local/stack: chaos-daemon in a mount namespace of its own,
# where its helpers are at the paths it runs them from and the host's /sys
# is at /host-sys, where its DaemonSet mounts it and where it looks for the
# cgroups it moves stressors into.
mkdir -p /host-sys
exec unshare --mount --propagation private -- sh -c '
  mount --bind "$dir/bin" /usr/local/bin && mount --bind "$dir/lib" /usr/local/lib &&
  mount --rbind /sys /host-sys &&
  exec /usr/local/bin/chaos-daemon "\$@"' chaos-daemon \\
  --runtime containerd --runtime-socket-path "$(containerd_sock)" --containerd-ns k8s.io \\
  --grpc-port $CHAOS_DAEMON_GRPC_PORT --http-port $CHAOS_DAEMON_HTTP_PORT \\
  --ca "$d/ca.crt" --cert "$d/server.crt" --key "$d/server.key"
EOF
  chmod +x "$launch"
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    start_process chaos-daemon -- "$launch"
  wait_ready chaos-daemon 60 chaos_daemon_ready
  chaos_daemon_slice | kubectl apply --server-side --force-conflicts -f - >/dev/null \
    || die "publishing the chaos-daemon EndpointSlice failed"
}

# Its metrics answer, and its gRPC port is open.
chaos_daemon_ready() {
  curl -fsS -o /dev/null "http://127.0.0.1:$CHAOS_DAEMON_HTTP_PORT/metrics" &&
    (exec 3<>"/dev/tcp/$HOST_POD_IP/$CHAOS_DAEMON_GRPC_PORT") 2>/dev/null
}

chaos_daemon_slice_name() { echo "chaos-daemon-$NODE_NAME"; }

# How chaos-controller-manager finds the daemon of the real node: an
# EndpointSlice in its namespace, named chaos-daemon-*, whose endpoint names
# the node. The address is the host's on the pods' bridge (the apiserver
# refuses loopback addresses in an EndpointSlice).
chaos_daemon_slice() {
  cat <<EOF
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: $(chaos_daemon_slice_name)
  namespace: $CHAOS_MESH_NAMESPACE
  labels: {app.kubernetes.io/name: chaos-daemon, app.kubernetes.io/managed-by: flashsale-stack}
addressType: IPv4
ports: [{name: grpc, port: $CHAOS_DAEMON_GRPC_PORT, protocol: TCP}]
endpoints:
- addresses: [$HOST_POD_IP]
  nodeName: $NODE_NAME
  conditions: {ready: true}
EOF
}

address_chaos-daemon() { echo "grpc+mtls://$HOST_POD_IP:$CHAOS_DAEMON_GRPC_PORT (node $NODE_NAME)"; }

# Stops the daemon, then checks, on the host and in every network namespace
# still alive, that nothing it injects was left behind; whatever is found is
# named and removed, so a stack that goes down leaves the host clean.
down_chaos-daemon() {
  stop_process chaos-daemon
  # The launcher's mount point, empty outside the daemon's namespace.
  rmdir /host-sys 2>/dev/null || true
  if live_pid apiserver >/dev/null; then
    kubectl -n "$CHAOS_MESH_NAMESPACE" delete endpointslice "$(chaos_daemon_slice_name)" --ignore-not-found >/dev/null 2>&1 || true
  fi
  local found
  found=$(chaos_residue)
  [ -z "$found" ] || { log "chaos-daemon left residue; removing it:"; printf '%s\n' "$found" >&2; }
  chaos_residue --remove >/dev/null
}

# residue [--all]: what chaos still does on the node; with --all, also what
# it left inert.
cmd_residue() { chaos_residue "$@"; }

# chaos_residue [--all|--remove]: prints one line per leftover of an
# injection that still acts: a stress process, and in a pod's network
# namespace (Chaos Mesh injects into pods only, never the host's) a
# netem/tbf/prio root qdisc or a jump from CHAOS-INPUT/CHAOS-OUTPUT into a
# fault's chain. Chaos Mesh's recovery removes the jump but keeps the
# fault's chain and its ipsets, inert (chaos-mesh issue #4336); --all lists
# those too, as "inert", and --remove removes everything it would list.
chaos_residue() {
  local remove=${1:-} pid ns seen
  # The stack runs in the host's network namespace.
  seen=" $(readlink "/proc/$$/ns/net") "
  for pid in $(pgrep -x stress-ng; pgrep -x memStress); do
    echo "process $pid $(cat "/proc/$pid/comm" 2>/dev/null)"
    [ "$remove" = --remove ] && { kill -KILL "$pid" 2>/dev/null || true; }
  done
  for pid in /proc/[0-9]*; do
    pid=${pid#/proc/}
    ns=$(readlink "/proc/$pid/ns/net" 2>/dev/null) || continue
    case "$seen" in *" $ns "*) continue ;; esac
    seen="$seen$ns "
    chaos_netns_residue "$pid" "$remove"
  done
  return 0
}

# chaos_netns_residue PID [--remove]: the leftovers in PID's network namespace.
chaos_netns_residue() {
  local pid=$1 remove=$2 dev chain set in=(nsenter --net="/proc/$1/ns/net" --)
  while read -r dev; do
    echo "netns of $pid: qdisc on $dev: $("${in[@]}" tc qdisc show dev "$dev" root)"
    [ "$remove" = --remove ] && { "${in[@]}" tc qdisc del dev "$dev" root 2>/dev/null || true; }
  done < <("${in[@]}" tc qdisc show 2>/dev/null | awk '$2 ~ /^(netem|tbf|prio)$/ && $3 == "root" { print $5 }' | sort -u)
  # chaos-daemon keeps its base chains (CHAOS-INPUT, CHAOS-OUTPUT) once
  # made; a jump from one into a fault's chain is a fault still acting.
  while read -r base target; do
    echo "netns of $pid: iptables $base jumps to $target: $("${in[@]}" iptables -S "$target" 2>/dev/null | grep -c '^-A') rules"
    [ "$remove" = --remove ] && { "${in[@]}" iptables -D "$base" -j "$target" 2>/dev/null || true; }
  done < <("${in[@]}" iptables -S 2>/dev/null | awk '$1 == "-A" && $2 ~ /^CHAOS-(INPUT|OUTPUT)$/ && $3 == "-j" { print $2, $4 }')
  [ -n "$remove" ] || return 0
  while read -r chain; do
    echo "netns of $pid: inert iptables chain $chain"
    if [ "$remove" = --remove ] && "${in[@]}" iptables -F "$chain" 2>/dev/null; then
      "${in[@]}" iptables -X "$chain" 2>/dev/null || true
    fi
  done < <("${in[@]}" iptables -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^(INPUT|OUTPUT)\// { print $2 }')
  # A pod has no ipset of its own: each is Chaos Mesh's. Its list set
  # (`…_set_tgt`) holds the others and is made last, so the newest go
  # first: a member of a list set cannot be destroyed before it.
  while read -r set; do
    echo "netns of $pid: inert ipset $set"
    [ "$remove" = --remove ] && { "${in[@]}" ipset destroy "$set" 2>/dev/null || true; }
  done < <("${in[@]}" ipset list -n 2>/dev/null | tac)
  return 0
}
