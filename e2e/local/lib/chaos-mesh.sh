# shellcheck shell=bash
# Chaos Mesh for the local stack: its CRDs (component chaos-mesh-crds) and
# chaos-controller-manager running out of cluster against the local apiserver
# (component chaos-mesh). Both come from one Chaos Mesh source, found in this
# order:
#   1. CHAOS_MESH_SOURCE: a release tarball or an extracted source folder;
#   2. ../shared/chaos-mesh/chaos-mesh-v$CHAOS_MESH_VERSION.tar.gz beside the clone;
#   3. the pinned upstream release, fetched with curl and checked against
#      CHAOS_MESH_TAR_SHA256 before it is used.
# Sourced by e2e/local/stack, which provides log, die, start_process, ...

CHAOS_MESH_VERSION=2.8.3
# GitHub's archive of the tag: `git archive --prefix=chaos-mesh-2.8.3/` of
# this commit (the archive's pax header names it: `git get-tar-commit-id`).
CHAOS_MESH_COMMIT=60ec97f1fd5d5edb2fb5c722c8888e18b618d1a0
CHAOS_MESH_URL=${CHAOS_MESH_URL:-https://github.com/chaos-mesh/chaos-mesh/archive/refs/tags/v$CHAOS_MESH_VERSION.tar.gz}
# sha256 of the UNCOMPRESSED tar stream of that archive. The gzip bytes differ
# between producers (compressor, level, header fields), while the tar stream
# git archive writes for one commit does not; so the tar is what is pinned.
CHAOS_MESH_TAR_SHA256=e16dd348472c0a789ab01b169ad034abda165339033b18a44bde0b20dc077f60
CHAOS_MESH_SHARED="$(cd "$ROOT/.." && pwd)/shared/chaos-mesh/chaos-mesh-v$CHAOS_MESH_VERSION.tar.gz"

# Ports in the stack's 20xxx range; both listen on 127.0.0.1 only.
CHAOS_MESH_METRICS_PORT=20280
CHAOS_MESH_WEBHOOK_PORT=20281
# The image pod-failure swaps into every container; the real node's
# containerd holds it, so nothing is pulled from outside.
PAUSE_IMAGE=${PAUSE_IMAGE:-localhost/flashsale/pause:1}
# The namespace chaos-controller-manager looks for chaos-daemon endpoints in.
CHAOS_MESH_NAMESPACE=chaos-mesh

# --- source ------------------------------------------------------------------

# chaos_mesh_source: prints "KIND PATH" of the first source found, KIND being
# explicit, shared or upstream (the cached download, fetched if missing).
chaos_mesh_source() {
  if [ -n "${CHAOS_MESH_SOURCE:-}" ]; then
    [ -e "$CHAOS_MESH_SOURCE" ] || die "CHAOS_MESH_SOURCE=$CHAOS_MESH_SOURCE does not exist"
    echo "explicit $(cd "$(dirname "$CHAOS_MESH_SOURCE")" && pwd)/$(basename "$CHAOS_MESH_SOURCE")"
  elif [ -f "$CHAOS_MESH_SHARED" ]; then
    echo "shared $(cd "$(dirname "$CHAOS_MESH_SHARED")" && pwd)/$(basename "$CHAOS_MESH_SHARED")"
  else
    chaos_mesh_fetch
    echo "upstream $(chaos_mesh_download)"
  fi
}

chaos_mesh_download() { echo "$CACHE/downloads/chaos-mesh-v$CHAOS_MESH_VERSION.tar.gz"; }

# sha256 of a tarball's uncompressed tar stream (see CHAOS_MESH_TAR_SHA256).
tar_stream_sha256() { gzip -dc "$1" | sha256sum | cut -d' ' -f1; }

# Fetches the pinned release once; only a verified archive reaches the cache.
chaos_mesh_fetch() {
  local out; out=$(chaos_mesh_download)
  [ -f "$out" ] && return 0
  command -v curl >/dev/null || die "curl is needed to fetch Chaos Mesh v$CHAOS_MESH_VERSION"
  mkdir -p "$(dirname "$out")"
  log "fetching Chaos Mesh v$CHAOS_MESH_VERSION from $CHAOS_MESH_URL"
  local tmp; tmp=$(mktemp "$out.XXXXXX")
  if ! curl -fsSL --retry 2 --connect-timeout 20 -o "$tmp" "$CHAOS_MESH_URL"; then
    rm -f "$tmp"
    die "Chaos Mesh v$CHAOS_MESH_VERSION not found. Provide it in one of three ways:
  1. CHAOS_MESH_SOURCE=<release tarball or extracted source folder>
  2. place chaos-mesh-v$CHAOS_MESH_VERSION.tar.gz (git archive of tag v$CHAOS_MESH_VERSION) at $CHAOS_MESH_SHARED
  3. allow the download of $CHAOS_MESH_URL (it failed just now)"
  fi
  local sum; sum=$(tar_stream_sha256 "$tmp" 2>/dev/null || true)
  if [ "$sum" != "$CHAOS_MESH_TAR_SHA256" ]; then
    rm -f "$tmp"
    die "the download of $CHAOS_MESH_URL is not Chaos Mesh v$CHAOS_MESH_VERSION: sha256 of its tar stream is ${sum:-unreadable}, expected $CHAOS_MESH_TAR_SHA256"
  fi
  mv "$tmp" "$out"
}

# chaos_mesh_key KIND PATH: a content key for the source. A tarball's key is
# its tar stream's sha256 (the pinned one for the shared copy and the
# download, which are checked); a folder's is the hash of its files.
chaos_mesh_key() {
  local kind=$1 path=$2 sum
  if [ -d "$path" ]; then
    sum=$(cd "$path" && find . -path ./.git -prune -o -type f -print0 | LC_ALL=C sort -z \
      | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
  else
    sum=$(tar_stream_sha256 "$path") || die "$path is not a gzip tarball"
    if [ "$kind" != explicit ] && [ "$sum" != "$CHAOS_MESH_TAR_SHA256" ]; then
      die "$path is not Chaos Mesh v$CHAOS_MESH_VERSION: sha256 of its tar stream is $sum, expected $CHAOS_MESH_TAR_SHA256"
    fi
  fi
  echo "$sum"
}

# chaos_mesh_resolve: sets CHAOS_MESH_KEY and CHAOS_MESH_SRC (the source
# tree), extracting a tarball into the cache once. Resolved once per run.
CHAOS_MESH_KEY=""
CHAOS_MESH_SRC=""
chaos_mesh_resolve() {
  [ -n "$CHAOS_MESH_SRC" ] && return 0
  local src kind path key dir
  src=$(chaos_mesh_source) || exit 1
  read -r kind path <<<"$src"
  key=$(chaos_mesh_key "$kind" "$path") || exit 1
  if [ -d "$path" ]; then
    dir=$path
  else
    dir="$CACHE/chaos-mesh-${key:0:12}"
    [ -f "$dir/.complete" ] || chaos_mesh_extract "$path" "$dir"
    dir="$dir/src"
  fi
  [[ -f "$dir/go.mod" && -d "$dir/cmd/chaos-controller-manager" ]] \
    || die "$path does not hold the Chaos Mesh source (no go.mod and cmd/chaos-controller-manager)"
  if [ "$kind" = explicit ] && [ "$key" != "$CHAOS_MESH_TAR_SHA256" ]; then
    log "Chaos Mesh from $path, as given (not checked against the pinned v$CHAOS_MESH_VERSION archive)"
  fi
  CHAOS_MESH_KEY=$key
  CHAOS_MESH_SRC=$dir
}

# The archive's single top folder (chaos-mesh-2.8.3/) becomes src/.
chaos_mesh_extract() {
  local tarball=$1 dir=$2
  log "extracting Chaos Mesh from $tarball"
  mkdir -p "$CACHE"
  local tmp; tmp=$(mktemp -d "$CACHE/.chaos-mesh-XXXXXX")
  tar -xzf "$tarball" -C "$tmp" --no-same-owner || { rm -rf "$tmp"; die "extracting $tarball failed"; }
  local top; top=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d)
  [[ "$(echo "$top" | wc -l)" = 1 && -n "$top" ]] || { rm -rf "$tmp"; die "$tarball does not have one top folder"; }
  mv "$top" "$tmp/src"
  touch "$tmp/.complete"
  rm -rf "$dir"
  mv "$tmp" "$dir"
}

# --- CRDs --------------------------------------------------------------------

# The per-kind CRD files of the source's Helm chart, copied into the cache so
# the folder stays the same for one source. Prints the folder.
chaos_mesh_crds() {
  chaos_mesh_resolve
  local src=$CHAOS_MESH_SRC out="$CACHE/chaos-mesh-crds-${CHAOS_MESH_KEY:0:12}"
  if [ ! -f "$out/.complete" ]; then
    [ -f "$src/helm/chaos-mesh/crds/chaos-mesh.org_podchaos.yaml" ] \
      || die "$src has no Chaos Mesh CRDs in helm/chaos-mesh/crds/"
    local tmp; tmp=$(mktemp -d "$CACHE/.chaos-mesh-crds-XXXXXX")
    cp "$src"/helm/chaos-mesh/crds/*.yaml "$tmp/"
    touch "$tmp/.complete"
    rm -rf "$out"
    mv "$tmp" "$out"
  fi
  echo "$out"
}

install_chaos-mesh-crds() { chaos_mesh_crds >/dev/null; }

# CRDs are data, not a process: "ready" means established in the apiserver.
up_chaos-mesh-crds() {
  local d; d=$(chaos_mesh_crds)
  kubectl apply --server-side --force-conflicts -f "$d" >/dev/null || die "applying Chaos Mesh CRDs from $d failed"
  kubectl wait --for=condition=Established --timeout=60s \
    crd/podchaos.chaos-mesh.org crd/networkchaos.chaos-mesh.org crd/stresschaos.chaos-mesh.org >/dev/null \
    || die "Chaos Mesh CRDs were not established within 60s"
}
is_up_chaos-mesh-crds() { live_pid apiserver >/dev/null && kubectl get crd podchaos.chaos-mesh.org >/dev/null 2>&1; }
address_chaos-mesh-crds() { echo "chaos-mesh.org/v1alpha1 (v$CHAOS_MESH_VERSION)"; }

# --- chaos-controller-manager ------------------------------------------------

# Built once per source and Go version, like go_build.
chaos_mesh_bin_dir() {
  chaos_mesh_resolve
  echo "$CACHE/bin/chaos-mesh-$( (echo "$CHAOS_MESH_KEY"; go env GOVERSION) | sha256sum | cut -c1-12)"
}

install_chaos-mesh() {
  command -v go >/dev/null || die "Go is needed to build Chaos Mesh (Go >= 1.26)"
  chaos_mesh_resolve
  local src=$CHAOS_MESH_SRC out; out=$(chaos_mesh_bin_dir)
  [ -f "$out/.complete" ] && return 0
  log "building chaos-controller-manager from $src with Go; the first build takes minutes, later ones are cached"
  mkdir -p "$CACHE/bin"
  local tmp; tmp=$(mktemp -d "$CACHE/bin/.build-XXXXXX")
  ( cd "$src" && CGO_ENABLED=0 go build -ldflags "$(chaos_mesh_version_ldflags)" -o "$tmp/" ./cmd/chaos-controller-manager ) \
    || { rm -rf "$tmp"; die "building chaos-controller-manager failed"; }
  touch "$tmp/.complete"
  rm -rf "$out"
  mv "$tmp" "$out"
}

# An archive carries no git metadata: the -ldflags that stamp the version a
# binary logs at start, which only the pinned release is known to be.
chaos_mesh_version_ldflags() {
  [ "$CHAOS_MESH_KEY" = "$CHAOS_MESH_TAR_SHA256" ] || return 0
  echo "-X github.com/chaos-mesh/chaos-mesh/pkg/version.gitVersion=v$CHAOS_MESH_VERSION" \
    "-X github.com/chaos-mesh/chaos-mesh/pkg/version.gitCommit=$CHAOS_MESH_COMMIT"
}

# A self-signed pair for the webhook server, which always starts and needs
# one; nothing calls it, since no webhook configuration is registered.
chaos_mesh_certs() {
  local d="$STATE/chaos-mesh/certs"
  [ -f "$d/tls.crt" ] && [ -f "$d/tls.key" ] && return 0
  mkdir -p "$d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=localhost" \
    -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
    -keyout "$d/tls.key" -out "$d/tls.crt" 2>/dev/null || die "creating the Chaos Mesh webhook certificate failed"
}

# Out of cluster with the admin kubeconfig. No webhooks are registered, so
# experiments must name selector.namespaces (or selector.pods) themselves;
# leader election is off: one instance, and a restart must not wait for a
# stale Lease. It resolves names as in its pod: a NetworkChaos's
# externalTargets (a store by its Service's name) through the cluster's DNS.
up_chaos-mesh() {
  chaos_mesh_certs
  chaos_daemon_certs
  chaos_mesh_namespace
  local bin; bin=$(chaos_mesh_launcher "$(chaos_mesh_bin_dir)/chaos-controller-manager")
  # It reads its settings from the environment only; it talks to
  # chaos-daemon over mutual TLS (chaos-daemon.sh).
  (
    # shellcheck disable=SC2046 # the words are NAME=VALUE pairs without spaces
    export $(chaos_daemon_client_env)
    export NAMESPACE="$CHAOS_MESH_NAMESPACE" CERTS_DIR="$STATE/chaos-mesh/certs" \
      ENABLED_WEBHOOKS=none SECURITY_MODE=false ENABLE_LEADER_ELECTION=false CLUSTER_SCOPED=true \
      QPS=1000 BURST=2000 METRICS_HOST=127.0.0.1 METRICS_PORT="$CHAOS_MESH_METRICS_PORT" \
      WEBHOOK_HOST=127.0.0.1 WEBHOOK_PORT="$CHAOS_MESH_WEBHOOK_PORT" POD_FAILURE_PAUSE_IMAGE="$PAUSE_IMAGE"
    start_process chaos-mesh -- "$bin" --kubeconfig="$(KUBECONFIG_FILE)"
  )
  wait_ready chaos-mesh 60 chaos_mesh_ready
}

# chaos_mesh_launcher BIN: prints a launcher, named like the controller so
# the stack's liveness check knows the process before and after the exec,
# that runs BIN in a mount namespace of its own whose /etc/resolv.conf asks
# the cluster's DNS (CoreDNS on the bridge) first and the host's resolvers
# after, with the search path of a pod in the controller's namespace.
chaos_mesh_launcher() {
  local bin=$1 d="$STATE/chaos-mesh/launch"
  mkdir -p "$d"
  {
    echo "nameserver $HOST_POD_IP"
    awk '$1 == "nameserver" && $2 !~ /^127\./ {print}' /etc/resolv.conf | head -n 2
    echo "search $CHAOS_MESH_NAMESPACE.svc.$CLUSTER_DOMAIN svc.$CLUSTER_DOMAIN $CLUSTER_DOMAIN"
    echo "options ndots:5 timeout:1 attempts:2"
  } >"$d/resolv.conf"
  cat >"$d/chaos-controller-manager" <<EOF
#!/bin/sh
# Written by e2e/local/stack: chaos-controller-manager with the cluster's DNS.
exec unshare --mount --propagation private -- sh -c '
  mount --bind "$d/resolv.conf" /etc/resolv.conf && exec "$bin" "\$@"' chaos-controller-manager "\$@"
EOF
  chmod +x "$d/chaos-controller-manager"
  echo "$d/chaos-controller-manager"
}

# The namespace the controller and the daemon's EndpointSlice live in.
chaos_mesh_namespace() {
  kubectl get namespace "$CHAOS_MESH_NAMESPACE" >/dev/null 2>&1 \
    || kubectl create namespace "$CHAOS_MESH_NAMESPACE" >/dev/null || die "creating namespace $CHAOS_MESH_NAMESPACE failed"
}

# Metrics answer, and the PodChaos controller has started its workers (its
# caches synced) since the latest start.
chaos_mesh_ready() {
  curl -fsS -o /dev/null "http://127.0.0.1:$CHAOS_MESH_METRICS_PORT/metrics" &&
    awk '/^=== .* start: /{ok=0} /Starting workers.*"podchaos-pipeline"/{ok=1} END{exit !ok}' "$(logfile chaos-mesh)"
}

address_chaos-mesh() { echo "http://127.0.0.1:$CHAOS_MESH_METRICS_PORT/metrics"; }

# For `env`: the CRD folder when a source is at hand, without fetching.
chaos_mesh_crds_known() {
  [ -n "${CHAOS_MESH_SOURCE:-}" ] || [ -f "$CHAOS_MESH_SHARED" ] || [ -f "$(chaos_mesh_download)" ] || return 0
  chaos_mesh_crds
}

# chaos-controller-manager stops its manager on the first TERM but then waits
# for a second signal (its fx application starts only after the manager has
# returned), so: TERM, wait until the manager is done, TERM again; KILL only
# what is still there after the deadline. By its pid only.
down_chaos-mesh() {
  local pid
  pid=$(live_pid chaos-mesh) || { rm -f "$(pidfile chaos-mesh)"; return 0; }
  log "stopping chaos-mesh (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || break
    if chaos_mesh_manager_stopped; then kill -TERM "$pid" 2>/dev/null || true; break; fi
    sleep 0.1
  done
  pid_gone "$pid" 50 || {
    log "chaos-mesh did not stop; killing it"
    kill -KILL "$pid" 2>/dev/null || true
    pid_gone "$pid" 50 || true
  }
  rm -f "$(pidfile chaos-mesh)"
}

chaos_mesh_manager_stopped() {
  awk '/^=== .* start: /{ok=0} /proceeding to shutdown the manager/{ok=1} END{exit !ok}' "$(logfile chaos-mesh)"
}

# pid_gone PID TENTHS: true once PID has exited, polling every 0.1 s.
pid_gone() {
  for _ in $(seq 1 "$2"); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.1
  done
  ! kill -0 "$1" 2>/dev/null
}
