# Component `operator`: the operator as users install it, with the Helm
# chart (charts/flashsale-operator): two replicas on the real node in
# namespace flashsale-system, where Pod Security `restricted` is enforced,
# running under the chart's ServiceAccount and Role only (no kubeconfig in
# the pods), limited to the demo namespace, reading Prometheus through its
# flashsale-stack Service. Its image is the one `images` imported; a changed
# binary rolls the pods (the image's key is a pod annotation).
#
# CRDs go first by server-side apply of the chart's crds/: Helm installs CRDs
# but never upgrades them, and this is the upgrade path the chart documents.
# shellcheck shell=bash
OPERATOR_NAMESPACE=flashsale-system
OPERATOR_RELEASE=flashsale-operator
OPERATOR_CHART="$ROOT/charts/flashsale-operator"

helm() { "$(go_build_dir helm)/helm" --kubeconfig "$(KUBECONFIG_FILE)" "$@"; }
operator_selector() { echo "app.kubernetes.io/name=flashsale-operator,app.kubernetes.io/instance=$OPERATOR_RELEASE"; }

# apply_crds: the chart's CRDs, applied server-side, then established.
apply_crds() {
  kubectl apply --server-side --force-conflicts -f "$OPERATOR_CHART/crds/" >/dev/null \
    || die "installing the CRDs failed"
  kubectl wait --for condition=established --timeout=60s crd/flashsales.flashsale.dev \
    crd/degradationpolicies.flashsale.dev crd/chaosdrills.flashsale.dev >/dev/null \
    || die "the CRDs did not become established"
}

up_operator() {
  apply_crds
  kubectl get namespace "$DEMO_NAMESPACE" >/dev/null 2>&1 || kubectl create namespace "$DEMO_NAMESPACE" >/dev/null
  kubectl apply --server-side -f - >/dev/null <<YAML || die "creating namespace $OPERATOR_NAMESPACE failed"
apiVersion: v1
kind: Namespace
metadata:
  name: $OPERATOR_NAMESPACE
  labels:
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/warn: restricted
YAML
  local key; key=$(image_key operator) || die "the operator's image is not built (e2e/local/stack up images)"
  # helm warns that crds/ holds symbolic links; that is how the chart shares them.
  helm upgrade --install "$OPERATOR_RELEASE" "$OPERATOR_CHART" -n "$OPERATOR_NAMESPACE" \
    --set watchNamespace="$DEMO_NAMESPACE" --set prometheusURL="$POD_PROMETHEUS_URL" \
    --set-string "podAnnotations.flashsale\.dev/image-key=$key" \
    --set-json "nodeSelector={\"$NODE_LABEL\":\"true\"}" \
    --set-json "tolerations=[{\"key\":\"$NODE_LABEL\",\"operator\":\"Exists\",\"effect\":\"NoSchedule\"}]" \
    --set resources.requests.cpu=20m --set resources.requests.memory=64Mi \
    --wait --timeout 180s 2> >(grep -v 'found symbolic link' >&2) >/dev/null \
    || { logs_operator | tail -n 30 >&2; die "helm could not install the operator"; }
  kubectl -n "$OPERATOR_NAMESPACE" get pods -l "$(operator_selector)" -o wide >&2
}

is_up_operator() {
  local ready
  live_pid apiserver >/dev/null || return 1
  ready=$(kubectl -n "$OPERATOR_NAMESPACE" get deployment "$OPERATOR_RELEASE" \
    -o jsonpath='{.status.readyReplicas}/{.spec.replicas}' 2>/dev/null) || return 1
  [ -n "${ready%%/*}" ] && [ "${ready%%/*}" = "${ready##*/}" ]
}

down_operator() {
  live_pid apiserver >/dev/null || return 0
  helm status "$OPERATOR_RELEASE" -n "$OPERATOR_NAMESPACE" >/dev/null 2>&1 || return 0
  log "uninstalling the operator's release"
  helm uninstall "$OPERATOR_RELEASE" -n "$OPERATOR_NAMESPACE" --wait --timeout 120s >/dev/null \
    || log "helm uninstall of the operator failed"
}

address_operator() { echo "helm release $OPERATOR_RELEASE in $OPERATOR_NAMESPACE"; }

# Every replica's log, each line prefixed with its pod.
logs_operator() {
  kubectl -n "$OPERATOR_NAMESPACE" logs -l "$(operator_selector)" --prefix --tail=-1 2>&1 || true
}

env_operator() {
  echo "export FLASHSALE_OPERATOR_NAMESPACE='$OPERATOR_NAMESPACE'"
  echo "export FLASHSALE_OPERATOR_RELEASE='$OPERATOR_RELEASE'"
}
