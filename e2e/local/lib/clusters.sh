# shellcheck shell=bash
# Optional clusters for failover tests, on 127.0.0.1 only and not part of
# `all`: a Redis Cluster of three primaries with a replica each, and three
# KRaft Kafka nodes that are brokers and controllers at once. Each node is a
# process of its own (pid file and log named after it), so a test can SIGKILL
# one and `up` brings back just that one. Sourced by e2e/local/stack.
#
#   e2e/local/stack up redis-cluster kafka-cluster

# Primaries at creation: the first three. Each node gossips on its port + 10000
# (27001-27006).
REDIS_CLUSTER_PORTS=(17001 17002 17003 17004 17005 17006)
# Node N (1-3) serves clients on 19N92 and its controller on 19N93, clear of
# the single broker's 19092-19094.
KAFKA_CLUSTER_NODES=(1 2 3)
kafka_cluster_port() { echo $((19092 + 100 * $1)); }
kafka_cluster_controller_port() { echo $((19093 + 100 * $1)); }
kafka_cluster_brokers() {
  local n out=()
  for n in "${KAFKA_CLUSTER_NODES[@]}"; do out+=("127.0.0.1:$(kafka_cluster_port "$n")"); done
  local IFS=,; echo "${out[*]}"
}

# --- redis-cluster -------------------------------------------------------------

members_redis-cluster() { printf 'redis-cluster-%s\n' "${REDIS_CLUSTER_PORTS[@]}"; }
install_redis-cluster() { install_debian_packages; }

# Starts the nodes that are not running (all of them the first time), creates
# the cluster unless their nodes.conf files already hold it, then waits until
# it serves every slot with a replica behind each primary. A node restarted
# after a kill rejoins from its nodes.conf, as a replica if its own was
# promoted meanwhile.
up_redis-cluster() {
  local port started=()
  for port in "${REDIS_CLUSTER_PORTS[@]}"; do
    live_pid "redis-cluster-$port" >/dev/null && continue
    local dir="$STATE/redis-cluster/$port"; mkdir -p "$dir"
    # A node timeout of 2 s: replicas take over within seconds, which is what
    # failover tests measure.
    start_process "redis-cluster-$port" -- redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
      --maxmemory-policy noeviction --appendonly yes --appendfsync everysec --save "" --daemonize no
    started+=("$port")
  done
  for port in "${started[@]}"; do
    wait_ready "redis-cluster-$port" 20 redis_cluster_ping "$port"
  done
  redis_cluster_create
  wait_ready redis-cluster 60 redis_cluster_ready
}

redis_cluster_cli() { local port=$1; shift; redis-cli -h 127.0.0.1 -p "$port" "$@" 2>/dev/null | tr -d '\r'; }
redis_cluster_ping() { [ "$(redis_cluster_cli "$1" ping)" = PONG ]; }
# redis_cluster_info PORT FIELD: one field of CLUSTER INFO.
redis_cluster_info() { redis_cluster_cli "$1" cluster info | sed -n "s/^$2://p"; }

# Creates the cluster when every node is new; nodes that know only themselves
# beside nodes of a cluster mean a node lost its files, which needs a fresh start.
redis_cluster_create() {
  local port new=() joined=() addrs=()
  for port in "${REDIS_CLUSTER_PORTS[@]}"; do
    if [ "$(redis_cluster_info "$port" cluster_known_nodes)" = 1 ]; then new+=("$port"); else joined+=("$port"); fi
    addrs+=("127.0.0.1:$port")
  done
  [ ${#new[@]} -eq 0 ] && return 0
  [ ${#joined[@]} -eq 0 ] || die "Redis Cluster nodes ${new[*]} are not in the cluster of ${joined[*]}; start it afresh: e2e/local/stack down redis-cluster && rm -rf $STATE/redis-cluster"
  log "creating the Redis Cluster: primaries ${REDIS_CLUSTER_PORTS[*]:0:3}, one replica each"
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >>"$(logfile redis-cluster)" 2>&1 \
    || die "creating the Redis Cluster failed; log: $(logfile redis-cluster)"
}

# Every node sees the cluster as ok, and every primary that serves slots has
# a replica streaming from it.
redis_cluster_ready() {
  local port myself
  for port in "${REDIS_CLUSTER_PORTS[@]}"; do
    [ "$(redis_cluster_info "$port" cluster_state)" = ok ] || return 1
    myself=$(redis_cluster_cli "$port" cluster nodes | awk '$3 ~ /myself/')
    [ -n "$myself" ] || return 1
    # Fields 9 on are the node's slot ranges.
    if echo "$myself" | awk '$3 ~ /master/ && NF >= 9 {found=1} END {exit !found}'; then
      redis_cluster_cli "$port" info replication | grep -q '^slave[0-9]*:.*state=online' || return 1
    fi
  done
}

address_redis-cluster() { echo "redis://127.0.0.1:17001-17006 (3+3)"; }

# Seeds for cluster clients: every node, so any one of them answering is enough.
env_redis-cluster() {
  any_member_live redis-cluster || return 0
  local port urls=()
  for port in "${REDIS_CLUSTER_PORTS[@]}"; do urls+=("redis://127.0.0.1:$port"); done
  local IFS=,; echo "export FLASHSALE_REDIS_CLUSTER_URL='${urls[*]}'"
}

# While a test has one node killed, the cluster still counts as running.
any_member_live() {
  local m
  for m in $(members "$1"); do live_pid "$m" >/dev/null && return 0; done
  return 1
}

# --- kafka-cluster -------------------------------------------------------------

members_kafka-cluster() { printf 'kafka-cluster-%s\n' "${KAFKA_CLUSTER_NODES[@]}"; }
install_kafka-cluster() { install_kafka; }

# Starts the nodes that are not running (all of them the first time: the
# controllers need a quorum of two to start), waits until all three brokers
# are registered, then creates the topics the workloads write to, replicated
# to all three.
up_kafka-cluster() {
  local dir="$STATE/kafka-cluster" n started=() voters=()
  mkdir -p "$dir"
  kafka_log4j "$dir/log4j2.properties"
  # One cluster id for all nodes, kept for nodes formatted later.
  [ -s "$dir/cluster.id" ] || new_kafka_cluster_id >"$dir/cluster.id"
  for n in "${KAFKA_CLUSTER_NODES[@]}"; do voters+=("$n@127.0.0.1:$(kafka_cluster_controller_port "$n")"); done
  local java=(java -Xms128m -Xmx384m -XX:+UseG1GC -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$dir/log4j2.properties" -cp "$(kafka_dir)/libs/*")
  for n in "${KAFKA_CLUSTER_NODES[@]}"; do
    live_pid "kafka-cluster-$n" >/dev/null && continue
    mkdir -p "$dir/$n"
    kafka_cluster_properties "$n" "$(IFS=,; echo "${voters[*]}")" >"$dir/$n/server.properties"
    if [ ! -f "$dir/$n/data/meta.properties" ]; then
      log "formatting Kafka storage of node $n (cluster $(cat "$dir/cluster.id"))"
      "${java[@]}" kafka.tools.StorageTool format -t "$(cat "$dir/cluster.id")" -c "$dir/$n/server.properties" \
        >>"$(logfile "kafka-cluster-$n")" 2>&1 \
        || die "formatting Kafka storage of node $n failed; log: $(logfile "kafka-cluster-$n")"
    fi
    start_process "kafka-cluster-$n" -- "${java[@]}" kafka.Kafka "$dir/$n/server.properties"
    started+=("$n")
  done
  for n in "${started[@]}"; do
    wait_ready "kafka-cluster-$n" 120 kafka_started "kafka-cluster-$n" "$(kafka_cluster_port "$n")"
  done
  wait_ready kafka-cluster 60 kafka_cluster_registered
  kafka_topic flashsale.orders 6 "$(kafka_cluster_brokers)" 3
  kafka_topic flashsale.orders.dlq 1 "$(kafka_cluster_brokers)" 3
}

# kafka_cluster_properties NODE VOTERS: node NODE's server.properties.
kafka_cluster_properties() {
  local n=$1 port controller; port=$(kafka_cluster_port "$1"); controller=$(kafka_cluster_controller_port "$1")
  cat <<EOF
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$2
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$STATE/kafka-cluster/$n/data
num.partitions=6
auto.create.topics.enable=false
default.replication.factor=3
min.insync.replicas=2
offsets.topic.replication.factor=3
offsets.topic.num.partitions=6
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
unclean.leader.election.enable=false
group.initial.rebalance.delay.ms=0
log.retention.hours=24
EOF
}

# All three brokers are registered (and unfenced): the metadata names them.
kafka_cluster_registered() {
  [ "$(kafka_tool org.apache.kafka.tools.BrokerApiVersionsCommand --bootstrap-server "$(kafka_cluster_brokers)" \
    | grep -cE '^127\.0\.0\.1:[0-9]+ \(id: [0-9]+ ')" = ${#KAFKA_CLUSTER_NODES[@]} ]
}

address_kafka-cluster() { echo "127.0.0.1:19192,19292,19392"; }

env_kafka-cluster() {
  any_member_live kafka-cluster || return 0
  echo "export FLASHSALE_KAFKA_CLUSTER_BROKERS='$(kafka_cluster_brokers)'"
}
