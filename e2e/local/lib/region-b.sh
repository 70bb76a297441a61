# shellcheck shell=bash
# shellcheck disable=SC2153 # KAFKA_PORT and the others are region A's, set in e2e/local/stack
# A standby region beside the stack, for failover checks: optional, like the
# clusters, and started by `test`. Each part is a real component:
#
#   redis-a          region A's Redis for a failover pair (16381): one of its
#                    own, since the stack's Redis must stay replica-free for
#                    the sales whose `auto` durability picks `fast` there
#   redis-b          region B's Redis (16382), REPLICAOF redis-a; promoted on failover
#   postgres-b       region B's PostgreSQL (15433), written by B's order-writer
#   kafka-b          region B's Kafka (19592; pods: 19594), its own cluster
#   mirror-maker     Kafka's MirrorMaker 2 copying A's order topics into kafka-b
#                    under the same names (IdentityReplicationPolicy)
#   etcd-b,          region B's own cluster: an apiserver (16453, on the bridge
#   apiserver-b      address) with the operator's and Chaos Mesh's CRDs and no
#                    nodes, for what reads the standby through a kubeconfig
#   regions          Services and a `stores` Secret in the namespaces
#                    flashsale-region-a and flashsale-region-b, naming each
#                    region's stores as pods reach them
#   global-endpoint  HAProxy in front of both regions' gateways (18080;
#                    stats 18081): A primary, B `backup`, active health checks
#
#   e2e/local/stack up region-b
#   e2e/local/stack endpoint PRIMARY STANDBY [--interval 1s] [--fall 2] [--rise 2] [--health-port 9090]
#
# Sourced by e2e/local/stack.

REDIS_A_PORT=16381
REDIS_B_PORT=16382
POSTGRES_B_PORT=15433
KAFKA_B_PORT=19592
KAFKA_B_CONTROLLER_PORT=19593
KAFKA_B_PODS_PORT=19594
ETCD_B_PORT=12389
ETCD_B_PEER_PORT=12390
APISERVER_B_PORT=16453
ENDPOINT_PORT=18080
ENDPOINT_STATS_PORT=18081
# What A's mirror copies: the default order topics and the failover tests' own.
MIRRORED_TOPICS='flashsale\\.orders(\\.dlq)?|failover\\..*'

# --- redis-a, redis-b ------------------------------------------------------------

install_redis-a() { install_debian_packages; }
install_redis-b() { install_debian_packages; }

# A replica that follows it again (after a failover drill promoted it)
# syncs at once, not after Redis's default 5 s.
up_redis-a() { start_redis redis-a "$REDIS_A_PORT" --repl-diskless-sync-delay 0; }

# B follows A until a failover promotes it (REPLICAOF NO ONE); started
# again, it is A's replica again.
up_redis-b() {
  start_redis redis-b "$REDIS_B_PORT" --replicaof 127.0.0.1 "$REDIS_A_PORT"
  wait_ready redis-b 30 redis_replica_linked "$REDIS_B_PORT"
}

redis_replica_linked() {
  redis-cli -h 127.0.0.1 -p "$1" info replication 2>/dev/null | tr -d '\r' | grep -qx 'master_link_status:up'
}

address_redis-a() { echo "redis://127.0.0.1:$REDIS_A_PORT"; }
address_redis-b() { echo "redis://127.0.0.1:$REDIS_B_PORT (replica of redis-a)"; }

# --- postgres-b, kafka-b -----------------------------------------------------------

install_postgres-b() { install_debian_packages; }
up_postgres-b() { start_postgres postgres-b "$POSTGRES_B_PORT"; }
address_postgres-b() { echo "127.0.0.1:$POSTGRES_B_PORT"; }

install_kafka-b() { install_kafka; }
up_kafka-b() {
  start_single_broker kafka-b "$KAFKA_B_PORT" "$KAFKA_B_CONTROLLER_PORT" "$KAFKA_B_PODS_PORT"
}
address_kafka-b() { echo "127.0.0.1:$KAFKA_B_PORT"; }

# --- mirror-maker ------------------------------------------------------------------

install_mirror-maker() { install_kafka; install_maven_jars mirror-maker "Kafka MirrorMaker 2"; }

# MirrorMaker 2 in its dedicated mode, copying A's order topics into kafka-b
# under the same names, so region B's order-writer reads A's orders from the
# topic its own gateways write to, and stores each once by its id.
up_mirror-maker() {
  local dir="$STATE/mirror-maker"; mkdir -p "$dir"
  cat >"$dir/mm2.properties" <<EOF
clusters = A, B
A.bootstrap.servers = 127.0.0.1:$KAFKA_PORT
B.bootstrap.servers = 127.0.0.1:$KAFKA_B_PORT
A->B.enabled = true
B->A.enabled = false
A->B.topics = $MIRRORED_TOPICS
replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy
# New topics within seconds, and records as they come.
refresh.topics.interval.seconds = 5
refresh.groups.enabled = false
sync.topic.configs.enabled = false
sync.topic.acls.enabled = false
emit.checkpoints.enabled = false
sync.group.offsets.enabled = false
emit.heartbeats.interval.seconds = 1
# One broker each side.
replication.factor = 1
offset-syncs.topic.replication.factor = 1
heartbeats.topic.replication.factor = 1
checkpoints.topic.replication.factor = 1
config.storage.replication.factor = 1
offset.storage.replication.factor = 1
status.storage.replication.factor = 1
# Acknowledged by kafka-b before A's offset is committed as mirrored.
B.producer.acks = all
B.producer.linger.ms = 5
EOF
  kafka_log4j "$dir/log4j2.properties"
  # Heartbeats a MirrorMaker before this one left do not count.
  local before; before=$(mirror_maker_heartbeats)
  start_process mirror-maker -- java -Xms128m -Xmx384m -XX:+UseG1GC -Djava.awt.headless=true \
    "-Dlog4j2.configurationFile=$dir/log4j2.properties" -cp "$(maven_dir mirror-maker)/libs/*" \
    org.apache.kafka.connect.mirror.MirrorMaker "$dir/mm2.properties" --clusters B
  wait_ready mirror-maker 120 mirror_maker_beats_since "$before"
}

# The heartbeats MirrorMaker wrote into kafka-b (each second while its
# tasks run), 0 before the first.
mirror_maker_heartbeats() {
  kafka_tool org.apache.kafka.tools.GetOffsetShell --bootstrap-server "127.0.0.1:$KAFKA_B_PORT" \
    --topic heartbeats 2>/dev/null | awk -F: '{n += $3} END {print n + 0}'
}
mirror_maker_beats_since() { [ "$(mirror_maker_heartbeats)" -gt "$1" ]; }
address_mirror-maker() { echo "127.0.0.1:$KAFKA_PORT -> :$KAFKA_B_PORT (order topics, failover.*)"; }

# --- regions ---------------------------------------------------------------------

# Each region's stores as pods reach them: Services whose endpoints are the
# host's bridge address, and the Secret `stores` the suite and tests read
# (`e2e/src/stores.rs`). Region A shares the stack's Kafka and PostgreSQL.
up_regions() {
  local a=flashsale-region-a b=flashsale-region-b
  eval "$(env_stack-services)"
  apply_endpoints "$a" redis "" "redis:6379:TCP:$REDIS_A_PORT"
  apply_endpoints "$a" postgres "" "postgres:5432:TCP:$POSTGRES_PORT"
  apply_endpoints "$a" kafka "" "kafka:9092:TCP:$KAFKA_PODS_PORT"
  apply_endpoints "$b" redis "" "redis:6379:TCP:$REDIS_B_PORT"
  apply_endpoints "$b" postgres "" "postgres:5432:TCP:$POSTGRES_B_PORT"
  apply_endpoints "$b" kafka "" "kafka:9092:TCP:$KAFKA_B_PODS_PORT"
  region_stores_secret "$a"
  region_stores_secret "$b"
}

# region_stores_secret NAMESPACE: the Secret `stores` naming NAMESPACE's
# Services, with the same keys as flashsale-stack/stores.
region_stores_secret() {
  local ns=$1 svc="svc.cluster.local"
  kubectl -n "$ns" create secret generic stores \
    --from-literal=redis-url="redis://redis.$ns.$svc:6379" \
    --from-literal=database-url="postgres://$DB_USER:$DB_PASSWORD@postgres.$ns.$svc:5432/$DB_NAME" \
    --from-literal=kafka-brokers="kafka.$ns.$svc:9092" \
    --from-literal=prometheus-url="$POD_PROMETHEUS_URL" \
    --dry-run=client -o yaml | kubectl apply --server-side --force-conflicts -f - >/dev/null \
    || die "applying Secret $ns/stores failed"
}
is_up_regions() {
  live_pid apiserver >/dev/null && kubectl -n flashsale-region-b get secret stores >/dev/null 2>&1 \
    && kubectl -n flashsale-region-a get secret stores >/dev/null 2>&1
}
address_regions() { echo "{redis,postgres,kafka}.flashsale-region-{a,b}.svc"; }

# --- etcd-b, apiserver-b -----------------------------------------------------------
# Region B's cluster as another cluster's apiserver looks from here: its own
# etcd, the stack's PKI (so the admin's certificate works on both), reached
# on the bridge address by the host and the pods alike.

install_etcd-b() { install_component etcd; }
install_apiserver-b() { install_component apiserver; }

up_etcd-b() { start_etcd etcd-b "$ETCD_B_PORT" "$ETCD_B_PEER_PORT"; }

region_b_kubeconfig() { echo "$STATE/kube/region-b.kubeconfig"; }
kubectl_b() { "$(kube_bin kubectl)" --kubeconfig "$(region_b_kubeconfig)" "$@"; }

up_apiserver-b() {
  start_apiserver apiserver-b "$APISERVER_B_PORT" "$ETCD_B_PORT"
  write_kubeconfig_for "$(region_b_kubeconfig)" "https://$HOST_POD_IP:$APISERVER_B_PORT"
  kubectl_b apply --server-side --force-conflicts -f "$OPERATOR_CHART/crds/" -f "$(chaos_mesh_crds)" >/dev/null \
    || die "installing the CRDs in region B's cluster failed"
  kubectl_b wait --for condition=established --timeout=60s crd/flashsales.flashsale.dev \
    crd/degradationpolicies.flashsale.dev crd/chaosdrills.flashsale.dev crd/podchaos.chaos-mesh.org >/dev/null \
    || die "the CRDs did not become established in region B's cluster"
}

address_etcd-b() { echo "http://127.0.0.1:$ETCD_B_PORT"; }
address_apiserver-b() { echo "https://$HOST_POD_IP:$APISERVER_B_PORT (region B's cluster, no nodes)"; }

# --- global-endpoint ---------------------------------------------------------------

install_global-endpoint() { install_debian_packages haproxy; }

# Starts HAProxy on the last configuration `endpoint` wrote, or on one with
# no gateway yet (every request answered 503) until it is told.
up_global-endpoint() {
  local dir="$STATE/global-endpoint"; mkdir -p "$dir"
  [ -f "$dir/haproxy.cfg" ] || endpoint_config "" "" 1s 2 2 9090 >"$dir/haproxy.cfg"
  haproxy -c -q -f "$dir/haproxy.cfg" >>"$(logfile global-endpoint)" 2>&1 \
    || die "the global endpoint's configuration is invalid; log: $(logfile global-endpoint)"
  start_process global-endpoint -- haproxy -W -db -f "$dir/haproxy.cfg"
  wait_ready global-endpoint 20 port_open "$ENDPOINT_STATS_PORT"
}

# endpoint_config PRIMARY STANDBY INTERVAL FALL RISE HEALTH_PORT: A's
# gateways serve while their health check passes; B (`backup`) takes every
# request once A has failed FALL checks INTERVAL apart, the DNS TTL of a
# GSLB, and gives them back after RISE passing ones. A gateway is host:port;
# its health is /readyz on HEALTH_PORT of the same host (the ops port, 9090).
endpoint_config() {
  local primary=$1 standby=$2 interval=$3 fall=$4 rise=$5 health=$6
  cat <<EOF
# Written by e2e/local/stack endpoint; primary ${primary:-none}, standby ${standby:-none}.
global
  maxconn 4096
  stats socket $STATE/global-endpoint/admin.sock mode 600 level admin
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 10s
  timeout check 1s
  retries 1
  option redispatch
frontend global
  bind 127.0.0.1:$ENDPOINT_PORT
  bind $HOST_POD_IP:$ENDPOINT_PORT
  default_backend sale
  # Which region served: a failover check tells B's answers from A's.
  http-response set-header X-Flashsale-Region %[srv_name]
backend sale
  option httpchk GET /readyz
  http-check expect status 200
  default-server inter $interval fastinter $interval downinter $interval fall $fall rise $rise port $health
EOF
  [ -z "$primary" ] || echo "  server region-a $primary check"
  [ -z "$standby" ] || echo "  server region-b $standby check backup"
  cat <<EOF
listen stats
  bind 127.0.0.1:$ENDPOINT_STATS_PORT
  bind $HOST_POD_IP:$ENDPOINT_STATS_PORT
  stats enable
  stats uri /
EOF
}

# `endpoint PRIMARY STANDBY [--interval D] [--fall N] [--rise N]
# [--health-port P]`: points the global endpoint at the two regions'
# gateways (host:port each, e.g. the gateway Services' cluster IPs on port
# 80) and restarts it.
cmd_endpoint() {
  local primary="" standby="" interval=1s fall=2 rise=2 health=9090
  while [ $# -gt 0 ]; do
    case "$1" in
      --health-port) health=${2:?--health-port needs a port}; shift 2 ;;
      --interval) interval=${2:?--interval needs a duration}; shift 2 ;;
      --fall) fall=${2:?--fall needs a count}; shift 2 ;;
      --rise) rise=${2:?--rise needs a count}; shift 2 ;;
      -*) die "endpoint: unknown option '$1'" ;;
      *) if [ -z "$primary" ]; then primary=$1; elif [ -z "$standby" ]; then standby=$1
         else die "endpoint: PRIMARY and STANDBY only, got '$1'"; fi; shift ;;
    esac
  done
  [ -n "$standby" ] || die "usage: e2e/local/stack endpoint PRIMARY STANDBY [--interval 1s] [--fall 2] [--rise 2] [--health-port 9090]"
  local dir="$STATE/global-endpoint"; mkdir -p "$dir"
  endpoint_config "$primary" "$standby" "$interval" "$fall" "$rise" "$health" >"$dir/haproxy.cfg.new"
  haproxy -c -q -f "$dir/haproxy.cfg.new" >&2 || die "endpoint: HAProxy refused the configuration for $primary, $standby"
  mv "$dir/haproxy.cfg.new" "$dir/haproxy.cfg"
  stop_process global-endpoint
  cmd_up global-endpoint
  log "global endpoint http://127.0.0.1:$ENDPOINT_PORT: primary $primary, standby $standby (checks every $interval, down after $fall, up after $rise); stats http://127.0.0.1:$ENDPOINT_STATS_PORT/;csv"
}

address_global-endpoint() { echo "http://127.0.0.1:$ENDPOINT_PORT (stats :$ENDPOINT_STATS_PORT)"; }

env_regions() {
  live_pid redis-b >/dev/null || return 0
  cat <<EOF
export FLASHSALE_REGION_A_REDIS_URL='redis://127.0.0.1:$REDIS_A_PORT'
export FLASHSALE_REGION_B_REDIS_URL='redis://127.0.0.1:$REDIS_B_PORT'
export FLASHSALE_REGION_B_DATABASE_URL='postgres://$DB_USER:$DB_PASSWORD@127.0.0.1:$POSTGRES_B_PORT/$DB_NAME'
export FLASHSALE_REGION_B_KAFKA_BROKERS='127.0.0.1:$KAFKA_B_PORT'
export FLASHSALE_GLOBAL_ENDPOINT='http://127.0.0.1:$ENDPOINT_PORT'
export FLASHSALE_GLOBAL_ENDPOINT_STATS='http://127.0.0.1:$ENDPOINT_STATS_PORT/;csv'
EOF
  live_pid apiserver-b >/dev/null || return 0
  echo "export FLASHSALE_REGION_B_KUBECONFIG='$(region_b_kubeconfig)'"
}
