# shellcheck shell=bash
# The real node beside kwok's fake ones: a bridge for pods (network), containerd
# with runc, a kubelet, kube-proxy, cluster DNS (CoreDNS as a host process) and
# Services in front of the host's stores. Sourced by e2e/local/stack.
#
# Pods only land on the node when they tolerate its taint and select its label:
#   nodeSelector: {flashsale.dev/real-node: "true"}
#   tolerations: [{key: flashsale.dev/real-node, operator: Equal, value: "true", effect: NoSchedule}]

NODE_NAME=flashsale-node
NODE_LABEL=flashsale.dev/real-node
BRIDGE=fsbr0
# HOST_POD_IP (the host's address on the bridge) is set in e2e/local/stack: the
# stores and the apiserver listen there too.
POD_CIDR=10.89.0.0/24
SERVICE_CIDR=10.96.0.0/16
CLUSTER_DOMAIN=cluster.local
KUBE_DNS_IP=10.96.0.10
KUBELET_PORT=20250
KUBELET_HEALTHZ_PORT=20248
KUBE_PROXY_HEALTHZ_PORT=20256
KUBE_PROXY_METRICS_PORT=20249
COREDNS_HEALTH_PORT=20253
COREDNS_READY_PORT=20254
# Our own sandbox image (e2e/local/pause); Chaos Mesh's pod-failure needs one too.
PAUSE_IMAGE=localhost/flashsale/pause:1
# Chains of our own in the filter table, so teardown removes exactly what we added.
FORWARD_CHAIN=FLASHSALE-FORWARD

NODE_DEBIAN_PACKAGES=(containerd runc containernetworking-plugins iptables conntrack ipset iproute2 iputils-ping bind9-dnsutils gcc libc6-dev)

containerd_dir() { echo "$STATE/containerd"; }
containerd_sock() { echo "$STATE/containerd/containerd.sock"; }
cni_conf_dir() { echo "$STATE/cni/net.d"; }

# ctr against the node's containerd, in the namespace the kubelet uses.
ctr_k8s() { ctr --address "$(containerd_sock)" --namespace k8s.io "$@"; }
crictl_node() {
  "$(go_build_dir crictl)/crictl" --config /dev/null --runtime-endpoint "unix://$(containerd_sock)" \
    --image-endpoint "unix://$(containerd_sock)" --timeout 30s "$@"
}

install_node_packages() {
  install_debian_packages "${NODE_DEBIAN_PACKAGES[@]}"
}

# --- network -------------------------------------------------------------------

install_network() { install_node_packages; }

# The bridge pods hang off, with the host's address on it. The stores listen on
# that address too, so this comes first.
up_network() {
  # Links, iptables, network namespaces and mounts: the node is root's business.
  [ "$(id -u)" = 0 ] || die "the pod network and the real node need root"
  as_root modprobe br_netfilter 2>/dev/null || true
  [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ] \
    || die "br_netfilter is not available: bridged pod traffic would bypass kube-proxy's rules"
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    as_root ip link add "$BRIDGE" type bridge || die "creating bridge $BRIDGE failed"
  fi
  ip -4 addr show dev "$BRIDGE" | grep -qF " $HOST_POD_IP/" \
    || as_root ip addr add "$HOST_POD_IP/24" dev "$BRIDGE"
  as_root ip link set "$BRIDGE" up
  # Forwarding is restored on `down` if the stack turned it on.
  mkdir -p "$STATE/network"
  [ "$(cat /proc/sys/net/ipv4/ip_forward)" = 1 ] || [ -f "$STATE/network/ip_forward.was-off" ] \
    || touch "$STATE/network/ip_forward.was-off"
  as_root sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 >/dev/null \
    || die "enabling ip_forward and bridge-nf-call-iptables failed"
  # A FORWARD policy of DROP (Docker sets one) would cut pods off the host.
  iptables -w -N "$FORWARD_CHAIN" 2>/dev/null || true
  iptables -w -C "$FORWARD_CHAIN" -i "$BRIDGE" -j ACCEPT 2>/dev/null || iptables -w -A "$FORWARD_CHAIN" -i "$BRIDGE" -j ACCEPT
  iptables -w -C "$FORWARD_CHAIN" -o "$BRIDGE" -j ACCEPT 2>/dev/null || iptables -w -A "$FORWARD_CHAIN" -o "$BRIDGE" -j ACCEPT
  iptables -w -C FORWARD -j "$FORWARD_CHAIN" 2>/dev/null || iptables -w -I FORWARD -j "$FORWARD_CHAIN"
}
is_up_network() {
  ip -4 addr show dev "$BRIDGE" 2>/dev/null | grep -qF " $HOST_POD_IP/" \
    && [ "$(cat /proc/sys/net/ipv4/ip_forward)" = 1 ]
}
# Whether this state folder set the bridge up (and so takes it down).
owned_network() { [ -d "$STATE/network" ]; }
down_network() {
  # The bridge and the chains are the machine's, not the state folder's: only
  # the stack that set them up (its state folder says so) takes them down.
  owned_network || return 0
  # kube-proxy's chains go with the bridge (it may have been stopped before).
  if [ -x "$(kube_bin kube-proxy)" ] && iptables -w -t nat -S KUBE-SERVICES >/dev/null 2>&1; then
    "$(kube_bin kube-proxy)" --cleanup --proxy-mode=iptables >>"$(logfile kube-proxy)" 2>&1 || true
  fi
  remove_cni_rules
  remove_kubelet_chains
  if iptables -w -S "$FORWARD_CHAIN" >/dev/null 2>&1; then
    while iptables -w -D FORWARD -j "$FORWARD_CHAIN" 2>/dev/null; do :; done
    iptables -w -F "$FORWARD_CHAIN" && iptables -w -X "$FORWARD_CHAIN"
  fi
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    log "removing bridge $BRIDGE"
    as_root ip link delete "$BRIDGE"
  fi
  if [ -f "$STATE/network/ip_forward.was-off" ]; then
    as_root sysctl -qw net.ipv4.ip_forward=0 >/dev/null || true
  fi
  rm -rf "$STATE/network"
}
address_network() { echo "$BRIDGE $HOST_POD_IP/24 (pods $POD_CIDR)"; }

# The CNI bridge plugin's masquerade chains (CNI-<hash>, one per pod) and
# portmap's; normally removed per pod when the runtime stops it.
remove_cni_rules() {
  local rule chain
  { iptables-save -t nat 2>/dev/null || true; } | { grep -E '^-A POSTROUTING .*name: \\?"flashsale-pods' || true; } |
    while read -r rule; do
      chain=$(echo "$rule" | sed -n 's/.* -j \(CNI-[0-9a-f]*\).*/\1/p')
      eval "iptables -w -t nat ${rule/-A /-D }" 2>/dev/null || true
      if [ -n "$chain" ]; then iptables -w -t nat -F "$chain" 2>/dev/null; iptables -w -t nat -X "$chain" 2>/dev/null || true; fi
    done
}

# The chains the kubelet makes in both address families (a firewall against
# martian localhost traffic and canaries); kube-proxy's --cleanup leaves them.
remove_kubelet_chains() {
  local cmd table chain
  for cmd in iptables ip6tables; do
    command -v "$cmd" >/dev/null || continue
    "$cmd" -w -D INPUT -j KUBE-FIREWALL 2>/dev/null || true
    "$cmd" -w -D OUTPUT -j KUBE-FIREWALL 2>/dev/null || true
    for table in filter nat mangle; do
      for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
        # Deleted only once flushed; a chain that is not there is no error.
        # shellcheck disable=SC2015
        "$cmd" -w -t "$table" -F "$chain" 2>/dev/null && "$cmd" -w -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  done
}

# --- containerd ----------------------------------------------------------------

# Debian's containerd 1.6 serves the kubelet 1.37 well enough: the kubelet logs
# "RuntimeConfig ... Unimplemented" once and falls back to its own cgroupDriver
# (cgroupfs, as configured), so containerd 2 is not built.

install_containerd() {
  install_node_packages
  go_build crictl sigs.k8s.io/cri-tools/cmd/crictl
  build_pause_image >/dev/null
}

# The pause image as an OCI image layout archive, built from our C source with
# no registry and no Docker: one layer holding /pause. Cached by the source.
pause_archive() {
  local key; key=$( (cat "$HERE/pause/pause.c"; gcc --version | head -n 1; echo "$PAUSE_IMAGE") | sha256sum | cut -c1-12)
  echo "$CACHE/pause-$key.tar"
}
build_pause_image() {
  local out; out=$(pause_archive)
  if [ ! -f "$out" ]; then
    log "building the pause image $PAUSE_IMAGE"
    local tmp; tmp=$(mktemp -d "$CACHE/.pause-XXXXXX")
    ( set -e
      cd "$tmp"
      mkdir -p rootfs blobs/sha256
      gcc -static -Os -s -Wall -Wextra -o rootfs/pause "$HERE/pause/pause.c"
      tar --owner=0 --group=0 --numeric-owner --mtime=@0 -C rootfs -cf layer.tar pause
      local layer config manifest
      layer=$(blob layer.tar)
      printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"],"User":"65535:65535"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$layer" >config.json
      config=$(blob config.json)
      printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%d},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha256:%s","size":%d}]}' \
        "$config" "$(stat -c %s config.json)" "$layer" "$(stat -c %s layer.tar)" >manifest.json
      manifest=$(blob manifest.json)
      printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%d,"platform":{"architecture":"amd64","os":"linux"},"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
        "$manifest" "$(stat -c %s manifest.json)" "$PAUSE_IMAGE" "${PAUSE_IMAGE##*:}" >index.json
      echo '{"imageLayoutVersion":"1.0.0"}' >oci-layout
      tar --owner=0 --group=0 --numeric-owner --mtime=@0 -cf image.tar oci-layout index.json blobs
    ) || { rm -rf "$tmp"; die "building the pause image failed"; }
    mv "$tmp/image.tar" "$out"
    rm -rf "$tmp"
  fi
  echo "$out"
}
# blob FILE: stores FILE in the layout's blobs by its digest and prints the digest.
blob() {
  local d; d=$(sha256sum "$1" | cut -d' ' -f1)
  cp "$1" "blobs/sha256/$d"
  echo "$d"
}

write_containerd_config() {
  local d; d=$(containerd_dir)
  mkdir -p "$d/root" "$d/state" "$d/opt"
  # restrict_oom_score_adj: without CAP_SYS_RESOURCE (as in containers and some
  # VMs) runc cannot lower oom_score_adj to what the kubelet asks for the sandbox.
  cat >"$d/config.toml" <<EOF
# Written by e2e/local/stack.
version = 2
root = "$d/root"
state = "$d/state"

[grpc]
  address = "$(containerd_sock)"

[ttrpc]
  address = "$(containerd_sock).ttrpc"

[debug]
  level = "warn"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$d/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$(cni_conf_dir)"
    max_conf_num = 1
EOF
}

# The pod network: a bridge on fsbr0 with host-local addresses, masquerading
# only what leaves the pod subnet, and the host as the gateway.
write_cni_config() {
  mkdir -p "$(cni_conf_dir)" "$STATE/cni/ipam"
  cat >"$(cni_conf_dir)/10-flashsale.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "flashsale-pods",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$STATE/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$HOST_POD_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
EOF
}

up_containerd() {
  write_containerd_config
  write_cni_config
  start_process containerd -- containerd --config "$(containerd_dir)/config.toml"
  wait_ready containerd 30 ctr_k8s version
  # The sandbox image must be there before the first pod: nothing can pull it.
  # Imported again if it does not show: one CI run found it missing right
  # after an import that reported success.
  local attempt archive; archive=$(build_pause_image)
  for attempt in 1 2 3; do
    ctr_k8s images import "$archive" >>"$(logfile containerd)" 2>&1 \
      || die "importing $PAUSE_IMAGE into containerd failed"
    ctr_k8s images ls -q | grep -qxF "$PAUSE_IMAGE" && break
    log "$PAUSE_IMAGE not listed after import $attempt; images: $(ctr_k8s images ls -q | tr '\n' ' ')"
    [ "$attempt" = 3 ] && die "$PAUSE_IMAGE missing after 3 imports; containerd log: $(tail -n 20 "$(logfile containerd)")"
    sleep 1
  done
  # Pinned, like the project's images: the kubelet's image garbage collection
  # (a nearly full disk) must not take what no registry can give back.
  ctr_k8s images label "$PAUSE_IMAGE" io.cri-containerd.pinned=pinned >/dev/null \
    || die "labelling $PAUSE_IMAGE in containerd failed"
}
address_containerd() {
  local n; n=$(shim_pids | wc -l)
  # Containers that outlived a killed containerd still run: `down` ends them.
  if [ "$n" -gt 0 ] && ! live_pid containerd >/dev/null; then
    echo "$n orphaned shims (run: stack down containerd)"
  else
    echo "unix://$(containerd_sock)"
  fi
}

# Every pod sandbox stopped through the CRI (which also runs the CNI teardown
# and removes the network namespaces), then whatever task is left, the shims
# of this containerd and the mounts under the state folder.
down_containerd() {
  live_pid containerd >/dev/null && stop_pods
  stop_process containerd
  # After an unclean stop (containerd killed) the shims and their containers
  # are still there; without containerd they can only be killed.
  kill_shims
  unmount_under "$(containerd_dir)"
  unmount_netns
}

stop_pods() {
  local ids id
  if [ -x "$(go_build_dir crictl)/crictl" ]; then
    ids=$(crictl_node pods -q 2>/dev/null || true)
    for id in $ids; do crictl_node stopp "$id" >/dev/null 2>&1 || true; done
    for id in $ids; do crictl_node rmp -f "$id" >/dev/null 2>&1 || true; done
  fi
  # Anything the CRI did not know about (ctr run, say).
  for id in $(ctr_k8s tasks ls -q 2>/dev/null || true); do
    ctr_k8s tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
    ctr_k8s tasks delete -f "$id" >/dev/null 2>&1 || true
  done
}

# The shims daemonize away from containerd; ours carry its socket in argv.
shim_pids() {
  local sock p; sock=$(containerd_sock)
  for p in /proc/[0-9]*; do
    tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -qE "^[^ ]*containerd-shim[^ ]* .*-address $sock( |$)" && echo "${p#/proc/}"
  done
  return 0
}
kill_shims() {
  local pid kids
  for pid in $(shim_pids); do
    # A shim's children are container processes left behind: they go first.
    kids=$(cat "/proc/$pid/task/"*/children 2>/dev/null || true)
    log "killing shim $pid of $(containerd_sock) and its containers ${kids:-}"
    # shellcheck disable=SC2086 # split on purpose: one argument per pid
    [ -n "$kids" ] && kill -KILL $kids 2>/dev/null
    kill -KILL "$pid" 2>/dev/null || true
  done
}

# unmount_under DIR: every mount at or below DIR, deepest first (the kubelet
# bind-mounts its root folder onto itself).
unmount_under() {
  local dir=$1 m
  [ -d "$dir" ] || return 0
  dir=$(cd "$dir" && pwd -P)
  awk -v d="$dir" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do
    m=$(printf '%b' "$m")
    as_root umount "$m" 2>/dev/null || as_root umount -l "$m" 2>/dev/null || log "could not unmount $m"
  done
}

# Network namespaces the CRI made for our pods and left behind after an
# unclean stop: those holding an address of the pod subnet.
unmount_netns() {
  local ns name
  for ns in /run/netns/cni-*; do
    [ -e "$ns" ] || continue
    name=${ns##*/}
    ip netns exec "$name" ip -o -4 addr show 2>/dev/null | grep -qF " ${POD_CIDR%.*}." || continue
    as_root ip netns delete "$name" 2>/dev/null || true
  done
}

# --- kubelet -------------------------------------------------------------------

# issue_cert NAME SUBJECT EXTENSIONS: a certificate signed by the stack's CA,
# made once into the PKI folder.
issue_cert() {
  local d="$STATE/kube/pki" name=$1 subj=$2 ext=$3
  [ -f "$d/$name.crt" ] && return 0
  ( cd "$d" &&
    openssl req -newkey rsa:2048 -nodes -keyout "$name.key" -out "$name.csr" -subj "$subj" 2>/dev/null &&
    printf '%s\n' "$ext" >"$name.ext" &&
    openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$name.crt" -days 3650 \
      -extfile "$name.ext" 2>/dev/null &&
    rm -f "$name.csr" "$name.ext" ) || die "issuing certificate $name failed"
}

# write_client_kubeconfig FILE CERTNAME: a kubeconfig for a client certificate.
write_client_kubeconfig() {
  local d="$STATE/kube/pki"
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: flashsale-local
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority: $d/ca.crt
users:
- name: $2
  user:
    client-certificate: $d/$2.crt
    client-key: $d/$2.key
contexts:
- name: flashsale-local
  context: {cluster: flashsale-local, user: $2}
current-context: flashsale-local
EOF
}

up_kubelet() {
  local d="$STATE/kubelet" p="$STATE/kube/pki"
  mkdir -p "$d/root" "$d/pod-logs"
  issue_cert kubelet "/CN=$NODE_NAME" \
    "subjectAltName=IP:$HOST_POD_IP,IP:127.0.0.1,DNS:$NODE_NAME,DNS:localhost
extendedKeyUsage=serverAuth"
  issue_cert node "/O=system:nodes/CN=system:node:$NODE_NAME" "extendedKeyUsage=clientAuth"
  write_client_kubeconfig "$d/kubeconfig" node
  # Authentication by client certificates of the stack's CA (the apiserver's
  # kubelet client is one); authorization asks the apiserver (SubjectAccessReview),
  # as on a real cluster, so only admins get logs and exec.
  cat >"$d/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $HOST_POD_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $p/kubelet.crt
tlsPrivateKeyFile: $p/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $p/ca.crt}
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$(containerd_sock)
imageServiceEndpoint: unix://$(containerd_sock)
clusterDomain: $CLUSTER_DOMAIN
clusterDNS: [$KUBE_DNS_IP]
podLogsDir: $d/pod-logs
registerWithTaints:
- {key: $NODE_LABEL, value: "true", effect: NoSchedule}
maxPods: 110
serializeImagePulls: false
# A shared, busy machine: no evictions or image GC because a disk fills up.
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
rotateCertificates: false
serverTLSBootstrap: false
EOF
  KUBELET_STARTED=$(date +%s)
  start_process kubelet -- "$(kube_bin kubelet)" --config="$d/config.yaml" --kubeconfig="$d/kubeconfig" \
    --root-dir="$d/root" --hostname-override="$NODE_NAME" --node-ip="$HOST_POD_IP" \
    --node-labels="$NODE_LABEL=true" --v=1
  wait_ready kubelet 120 node_ready
}
# Ready as reported by this kubelet: the Node of a previous run keeps saying
# Ready for a while, so the heartbeat must be newer than our start.
node_ready() {
  local out
  curl -fsS "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz" >/dev/null || return 1
  out=$(kubectl get node "$NODE_NAME" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}') || return 1
  [ "${out%% *}" = True ] && [ "$(date -d "${out#* }" +%s)" -ge "$KUBELET_STARTED" ]
}
address_kubelet() { echo "node $NODE_NAME https://$HOST_POD_IP:$KUBELET_PORT"; }

# Containers outlive the kubelet; stopping them is containerd's teardown. The
# kubelet's own mounts (secrets, tokens) go here.
down_kubelet() {
  stop_process kubelet
  live_pid containerd >/dev/null && stop_pods
  unmount_under "$STATE/kubelet"
  remove_kubelet_chains
  # The kubelet links container logs here and cannot be told otherwise.
  find /var/log/containers -maxdepth 1 -type l -lname "$STATE/*" -delete 2>/dev/null || true
}

# --- kube-proxy ----------------------------------------------------------------

up_kube-proxy() {
  local d="$STATE/kube-proxy"; mkdir -p "$d"
  # conntrack sizes stay as the machine has them (maxPerCore 0).
  cat >"$d/config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $(KUBECONFIG_FILE)
hostnameOverride: $NODE_NAME
mode: iptables
clusterCIDR: $POD_CIDR
bindAddress: 127.0.0.1
healthzBindAddress: 127.0.0.1:$KUBE_PROXY_HEALTHZ_PORT
metricsBindAddress: 127.0.0.1:$KUBE_PROXY_METRICS_PORT
nodePortAddresses: [$HOST_POD_IP/32]
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
  start_process kube-proxy -- "$(kube_bin kube-proxy)" --config="$d/config.yaml" --v=1
  wait_ready kube-proxy 60 kube_proxy_ready
}
# Ready once it has synced: the kubernetes Service answers on its ClusterIP.
kube_proxy_ready() {
  curl -fsS --max-time 2 --cacert "$STATE/kube/pki/ca.crt" https://10.96.0.1/readyz | grep -q '^ok'
}
down_kube-proxy() {
  stop_process kube-proxy
  if [ -x "$(kube_bin kube-proxy)" ] && iptables -w -t nat -S KUBE-SERVICES >/dev/null 2>&1; then
    "$(kube_bin kube-proxy)" --cleanup --proxy-mode=iptables >>"$(logfile kube-proxy)" 2>&1 || true
  fi
}
address_kube-proxy() { echo "iptables, services $SERVICE_CIDR"; }

# --- coredns -------------------------------------------------------------------

install_coredns() { go_build coredns .; }

# CoreDNS answers on the host's bridge address. Pods reach it through the
# Service kube-dns (10.96.0.10, the address every kubeadm cluster uses, so
# manifests and tools that assume it work) whose EndpointSlice points at the
# host; host tools can ask 10.89.0.1 directly. Names outside the cluster are
# forwarded to the host's resolver.
up_coredns() {
  local d="$STATE/coredns"; mkdir -p "$d"
  local upstream; upstream=$(awk '$1=="nameserver" {print $2}' /etc/resolv.conf | grep -v '^127\.' | head -n 3 | tr '\n' ' ')
  {
    echo ".:53 {"
    echo "  bind $HOST_POD_IP"
    echo "  errors"
    echo "  health 127.0.0.1:$COREDNS_HEALTH_PORT"
    echo "  ready 127.0.0.1:$COREDNS_READY_PORT"
    echo "  kubernetes $CLUSTER_DOMAIN in-addr.arpa ip6.arpa {"
    echo "    kubeconfig $(KUBECONFIG_FILE)"
    echo "    pods insecure"
    echo "    fallthrough in-addr.arpa ip6.arpa"
    echo "    ttl 5"
    echo "  }"
    [ -n "${upstream// /}" ] && echo "  forward . $upstream"
    echo "  cache 5"
    echo "}"
  } >"$d/Corefile"
  start_process coredns -- "$(go_build_dir coredns)/coredns" -conf "$d/Corefile"
  wait_ready coredns 60 curl -fsS "http://127.0.0.1:$COREDNS_READY_PORT/ready"
  apply_endpoints kube-system kube-dns "$KUBE_DNS_IP" "dns:53:UDP:53 dns-tcp:53:TCP:53"
}
address_coredns() { echo "dns://$HOST_POD_IP:53 (service $KUBE_DNS_IP)"; }

# apply_endpoints NAMESPACE NAME CLUSTER_IP "PORTNAME:PORT:PROTO:TARGET ...": a
# Service without selector and its EndpointSlice to the host's bridge address.
# CLUSTER_IP may be empty (any).
apply_endpoints() {
  local ns=$1 name=$2 ip=$3 spec svc_ports="" eps_ports="" pn port proto target
  for spec in $4; do
    IFS=: read -r pn port proto target <<<"$spec"
    svc_ports+="  - {name: $pn, port: $port, protocol: $proto, targetPort: $target}"$'\n'
    eps_ports+="- {name: $pn, port: $target, protocol: $proto}"$'\n'
  done
  kubectl get namespace "$ns" >/dev/null 2>&1 || kubectl create namespace "$ns" >/dev/null
  kubectl apply --server-side --force-conflicts -f - >/dev/null <<EOF || die "applying Service $ns/$name failed"
apiVersion: v1
kind: Service
metadata:
  name: $name
  namespace: $ns
  labels: {app.kubernetes.io/managed-by: flashsale-local-stack}
spec:
${ip:+  clusterIP: $ip}
  ports:
$svc_ports
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: $name-host
  namespace: $ns
  labels:
    kubernetes.io/service-name: $name
    endpointslice.kubernetes.io/managed-by: flashsale-local-stack
addressType: IPv4
endpoints:
- addresses: [$HOST_POD_IP]
  conditions: {ready: true}
ports:
$eps_ports
EOF
}

# --- stack-services --------------------------------------------------------------

# Prometheus as pods reach it (the operator's pods read it).
POD_PROMETHEUS_URL=http://prometheus.flashsale-stack.svc.cluster.local:9090

# The host's stores and Prometheus as Services, so pods use the names a
# cluster would give them (the operator's pods read Prometheus), and the
# Secret `stores` naming them, from which the scenario finds them with a
# kubeconfig alone (as it does on a kind cluster, whose install writes it).
up_stack-services() {
  apply_endpoints flashsale-stack redis "" "redis:6379:TCP:$REDIS_PORT"
  apply_endpoints flashsale-stack postgres "" "postgres:5432:TCP:$POSTGRES_PORT"
  apply_endpoints flashsale-stack kafka "" "kafka:9092:TCP:$KAFKA_PODS_PORT"
  apply_endpoints flashsale-stack prometheus "" "http:9090:TCP:$PROMETHEUS_PORT"
  eval "$(env_stack-services)"
  kubectl -n flashsale-stack create secret generic stores \
    --from-literal=redis-url="$POD_REDIS_URL" --from-literal=database-url="$POD_DATABASE_URL" \
    --from-literal=kafka-brokers="$POD_KAFKA_BROKERS" --from-literal=prometheus-url="$POD_PROMETHEUS_URL" \
    --dry-run=client -o yaml | kubectl apply --server-side --force-conflicts -f - >/dev/null \
    || die "applying Secret flashsale-stack/stores failed"
}
is_up_stack-services() {
  live_pid apiserver >/dev/null && kubectl -n flashsale-stack get endpointslice prometheus-host >/dev/null 2>&1 \
    && kubectl -n flashsale-stack get secret stores >/dev/null 2>&1
}
address_stack-services() { echo "{redis,postgres,kafka,prometheus}.flashsale-stack.svc"; }

# --- env -----------------------------------------------------------------------

env_network() { echo "export HOST_POD_IP='$HOST_POD_IP'"; }
env_containerd() {
  echo "export PAUSE_IMAGE='$PAUSE_IMAGE'"
  echo "export CONTAINERD_ADDRESS='$(containerd_sock)'"
}
env_kubelet() {
  echo "export FLASHSALE_NODE='$NODE_NAME'"
  echo "export FLASHSALE_NODE_LABEL='$NODE_LABEL'"
}
# The stores as the sale's pods reach them, for tests and the demo sale.
env_stack-services() {
  echo "export POD_REDIS_URL='redis://redis.flashsale-stack.svc.cluster.local:6379'"
  echo "export POD_DATABASE_URL='postgres://$DB_USER:$DB_PASSWORD@postgres.flashsale-stack.svc.cluster.local:5432/$DB_NAME'"
  echo "export POD_KAFKA_BROKERS='kafka.flashsale-stack.svc.cluster.local:9092'"
  echo "export POD_PROMETHEUS_URL='$POD_PROMETHEUS_URL'"
}
