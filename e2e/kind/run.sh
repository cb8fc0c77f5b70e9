#!/usr/bin/env bash
# Kubernetes end-to-end test of IOP on a kind cluster. Needs Docker, kind, kubectl, helm,
# cargo, curl, openssl and python3 with PyYAML; see e2e/kind/README.md.
#
#   1. creates a kind cluster whose node ports IOP_KIND_GRPC_PORT (node gRPC) and
#      IOP_KIND_HTTP_NODE_PORT (HTTP API) are published on 127.0.0.1,
#   2. builds the Edge and operator images (Dockerfile) and loads them into the cluster,
#   3. applies crds/, creates the client API keys Secret (two fresh keys: one for every model,
#      one for none of the example's), installs charts/iop (IOP_KIND_EDGE_REPLICAS Edge
#      replicas, the chart's default 2; node gRPC and HTTP API as NodePorts; namespace under
#      the restricted Pod Security Standard) and applies examples/k8s/,
#   4. waits for the operator to render the Edge config, the Edge replicas to become ready,
#      and the config's `replicas` to list exactly the Edge pods,
#   5. makes the node bundle (Secret iop-node-<node> with kubectl, `iop-operator node-bundle`),
#   6. runs iop-mock-provider and iop-node on this host (cargo build), the node dialing the
#      Edge through the published node port until it holds a session with every replica;
#      asserts `kubectl get nodecatalogs` shows REPLICAS 2/2,
#   7. sends chat requests through the Edge's HTTP API Service (the published node port, with
#      `Authorization: Bearer KEY`) and through each replica (kubectl port-forward), and
#      asserts the mock's answer, that requests without a valid key or for a model the key
#      may not use are refused, that /admin/v1/* and /metrics are served on the admin port
#      only, and that `kubectl get providers` shows HEALTH available,
#   8. restarts the Edge (`kubectl rollout restart`) while a loop of requests runs through
#      the HTTP API Service, and asserts none failed and the node is back on every replica,
#   9. stops the mock provider and asserts HEALTH turns unavailable,
#  10. disables the key in the Secret and asserts the Edge refuses it (reloaded, no restart).
# Every wait is bounded; the cluster and the host processes are removed on exit (also on
# failure, after collecting diagnostics into IOP_KIND_WORK_DIR/diagnostics).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"

CLUSTER=${IOP_KIND_CLUSTER:-iop-e2e}
NAMESPACE=${IOP_KIND_NAMESPACE:-iop}
RELEASE=${IOP_KIND_RELEASE:-iop}
IMAGE_TAG=${IOP_KIND_IMAGE_TAG:-e2e}
# Node image for `kind create cluster` (empty: the kind release's default).
KIND_NODE_IMAGE=${IOP_KIND_NODE_IMAGE:-}
# Node port of the Edge's gRPC Service, published by kind on 127.0.0.1 of this host.
GRPC_PORT=${IOP_KIND_GRPC_PORT:-30743}
# Node port of the Edge's HTTP API Service, published by kind on 127.0.0.1 of this host.
HTTP_NODE_PORT=${IOP_KIND_HTTP_NODE_PORT:-30080}
# Edge replicas (the chart's default is 2).
EDGE_REPLICAS=${IOP_KIND_EDGE_REPLICAS:-2}
# First local ports of the `kubectl port-forward`s to each Edge pod's HTTP API and admin API
# (/admin/v1/*, /metrics): replica i (0, 1, ...) gets HTTP_PORT+i and ADMIN_PORT+i.
HTTP_PORT=${IOP_KIND_HTTP_PORT:-18080}
ADMIN_PORT=${IOP_KIND_ADMIN_PORT:-18180}
# Seconds for each wait (rollouts, config rendering, health changes).
TIMEOUT=${IOP_KIND_TIMEOUT:-180}
# 1: keep the cluster afterwards, and reuse an existing cluster of that name.
KEEP=${IOP_KIND_KEEP:-0}
# 1: install the chart with its NetworkPolicies on (kindnet enforces them).
NETWORK_POLICY=${IOP_KIND_NETWORK_POLICY:-1}
# Which provider of the rendered Edge config to test (empty: the first normalized ollama one).
PROVIDER=${IOP_KIND_PROVIDER:-}
WORK=${IOP_KIND_WORK_DIR:-$ROOT/target/kind-e2e}
CARGO_TARGET=${CARGO_TARGET_DIR:-$ROOT/target}

EDGE_IMAGE=iop-edge:$IMAGE_TAG
OPERATOR_IMAGE=iop-operator:$IMAGE_TAG
EDGE=$RELEASE-edge
OPERATOR=$RELEASE-operator
[[ $RELEASE == *iop* ]] || { EDGE=$RELEASE-iop-edge; OPERATOR=$RELEASE-iop-operator; }
EDGE_SELECTOR="app.kubernetes.io/component=edge,app.kubernetes.io/instance=$RELEASE"
CONFIG_MAP=iop-edge-config
EDGE_TLS_SECRET=iop-edge-tls
# The client API keys Secret (chart value edge.auth.keysSecret), made by this script.
KEYS_SECRET=iop-edge-keys

log() { printf '\n[kind-e2e %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() { printf '[kind-e2e] FAIL: %s\n' "$*" >&2; exit 1; }
k() { kubectl --context "kind-$CLUSTER" -n "$NAMESPACE" "$@"; }
exists() { k get "$@" -o name >/dev/null 2>&1; }

# Runs "$@" every 2 s until it succeeds, at most TIMEOUT seconds; $1 says what it waits for.
wait_for() {
  local what=$1 deadline=$((SECONDS + TIMEOUT))
  shift
  until "$@"; do
    ((SECONDS < deadline)) || die "timed out after ${TIMEOUT}s waiting for $what"
    sleep 2
  done
}

pids=()   # background processes of this script (node, port-forwards, request loop)
MOCK_PID=
created_cluster=0
cleanup() {
  local rc=$?
  set +e
  if ((rc != 0)); then
    log "failed (exit $rc): collecting diagnostics in ${WORK#"$ROOT"/}/diagnostics"
    collect_diagnostics
  fi
  [[ -z $MOCK_PID ]] || pids+=("$MOCK_PID")
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null
  done
  for pid in "${pids[@]}"; do
    wait "$pid" 2>/dev/null
  done
  # The node's private key and the API keys are only for this throwaway cluster, but keep
  # them out of artifacts.
  rm -rf "$WORK/bundle" "$WORK/keys"
  if ((created_cluster)) && [[ $KEEP != 1 ]]; then
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1
  elif [[ $KEEP == 1 ]]; then
    log "kept cluster kind-$CLUSTER (kind delete cluster --name $CLUSTER)"
  fi
  exit "$rc"
}

collect_diagnostics() {
  local d=$WORK/diagnostics
  mkdir -p "$d"
  k get all,providers,nodecatalogs,workspacetemplates,configmaps,leases,events -o wide >"$d/objects.txt" 2>&1
  k get secrets >"$d/secrets.txt" 2>&1
  k get providers,nodecatalogs,workspacetemplates -o yaml >"$d/iop-objects.yaml" 2>&1
  k get configmap "$CONFIG_MAP" -o yaml >"$d/edge-config.yaml" 2>&1
  k describe pods >"$d/pods.txt" 2>&1
  k logs "deployment/$OPERATOR" --all-containers --tail=-1 >"$d/operator.log" 2>&1
  # Every Edge replica, each line prefixed with its pod.
  k logs -l "$EDGE_SELECTOR" --all-containers --prefix --tail=-1 >"$d/edge.log" 2>&1
  k logs -l "$EDGE_SELECTOR" --all-containers --prefix --previous >"$d/edge-previous.log" 2>&1
  cp "$WORK"/*.log "$d/" 2>/dev/null
  local f
  for f in objects.txt operator.log edge.log node.log mock-provider.log; do
    [[ -s $d/$f ]] || continue
    echo "----- $f (last 40 lines)" >&2
    tail -n 40 "$d/$f" >&2
  done
}

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || die "$tool is not installed (see e2e/kind/README.md)"
  done
}

# --- 0. prerequisites ----------------------------------------------------------------
need docker kind kubectl helm cargo curl openssl python3
docker info >/dev/null 2>&1 || die "docker is not running (this test needs a container engine)"
python3 -c 'import yaml' 2>/dev/null || die "python3 lacks PyYAML (apt-get install python3-yaml)"
compgen -G "crds/*.yaml" >/dev/null || die "crds/ has no CRD YAML (generate it: iop-operator crds)"
compgen -G "examples/k8s/*.yaml" >/dev/null || die "examples/k8s/ has no example objects"
mkdir -p "$WORK"
rm -rf "$WORK/diagnostics" "$WORK/bundle" "$WORK/keys" "$WORK"/*.log
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- 1. cluster ----------------------------------------------------------------------
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  [[ $KEEP == 1 ]] || die "a kind cluster named $CLUSTER exists (delete it, or set IOP_KIND_KEEP=1 to reuse it)"
  # It must publish both node ports (a cluster this script created does).
  log "reusing kind cluster $CLUSTER"
else
  log "creating kind cluster $CLUSTER"
  cat >"$WORK/kind.yaml" <<EOF
kind: Cluster
apiVersion: kind.x-k8s.io/v1alpha4
nodes:
  - role: control-plane
    extraPortMappings:
      # The Edge's node gRPC NodePort, reachable from this host as 127.0.0.1:$GRPC_PORT.
      - containerPort: $GRPC_PORT
        hostPort: $GRPC_PORT
        listenAddress: 127.0.0.1
        protocol: TCP
      # The Edge's HTTP API NodePort (kube-proxy balances over the Ready replicas, and keeps
      # doing so through a rolling restart, which a port-forward to one pod cannot).
      - containerPort: $HTTP_NODE_PORT
        hostPort: $HTTP_NODE_PORT
        listenAddress: 127.0.0.1
        protocol: TCP
EOF
  created_cluster=1
  kind create cluster --name "$CLUSTER" --config "$WORK/kind.yaml" --wait "${TIMEOUT}s" \
    ${KIND_NODE_IMAGE:+--image "$KIND_NODE_IMAGE"}
fi

# --- 2. images and host binaries -----------------------------------------------------
log "building $EDGE_IMAGE and $OPERATOR_IMAGE"
docker build --target edge -t "$EDGE_IMAGE" .
docker build --target operator -t "$OPERATOR_IMAGE" .
kind load docker-image --name "$CLUSTER" "$EDGE_IMAGE" "$OPERATOR_IMAGE"

log "building iop-node, iop-mock-provider and iop-operator (node-bundle) for this host"
cargo build --locked -p iop-node -p iop-e2e -p iop-operator \
  --bin iop-node --bin iop-mock-provider --bin iop-operator
NODE_BIN=$CARGO_TARGET/debug/iop-node
MOCK_BIN=$CARGO_TARGET/debug/iop-mock-provider
OPERATOR_BIN=$CARGO_TARGET/debug/iop-operator

# --- 3. CRDs, chart, example objects -------------------------------------------------
log "applying crds/"
kubectl --context "kind-$CLUSTER" apply -f crds/
kubectl --context "kind-$CLUSTER" wait --for condition=Established --timeout="${TIMEOUT}s" \
  crd/providers.iop.dev crd/nodecatalogs.iop.dev crd/workspacetemplates.iop.dev

# The namespace enforces the restricted Pod Security Standard: a chart pod that breaks it
# is refused by the API server and its rollout times out.
kubectl --context "kind-$CLUSTER" create namespace "$NAMESPACE" --dry-run=client -o yaml \
  | kubectl --context "kind-$CLUSTER" apply -f -
kubectl --context "kind-$CLUSTER" label namespace "$NAMESPACE" --overwrite \
  pod-security.kubernetes.io/enforce=restricted pod-security.kubernetes.io/warn=restricted

# Client API keys, as a user makes them (NOTES.txt): a random key per principal, only its
# SHA-256 in keys.yaml (what `iop-edge new-key` prints), the file as Secret $KEYS_SECRET.
# KEY may use every model; OTHER_KEY only a model the examples do not have.
keys_dir=$WORK/keys
mkdir -p "$keys_dir"
chmod 0700 "$keys_dir"
new_key() { printf 'iop-%s' "$(openssl rand -hex 32)"; }
# The key's SHA-256 in hex (`printf %s "$KEY" | iop-edge hash-key`); the last field of
# `openssl dgst` output, which differs between OpenSSL and LibreSSL (macOS).
key_sha256() { printf %s "$1" | openssl dgst -sha256 | awk '{print $NF}'; }
KEY=$(new_key)
OTHER_KEY=$(new_key)
# write_keys DISABLED: keys.yaml with principal kind-e2e `disabled: DISABLED`, then the Secret.
write_keys() {
  cat >"$keys_dir/keys.yaml" <<EOF
principals:
  - { name: kind-e2e, key_sha256: $(key_sha256 "$KEY"), models: ["*"], disabled: $1 }
  - { name: kind-e2e-other, key_sha256: $(key_sha256 "$OTHER_KEY"), models: ["no-such-model-*"] }
EOF
  k create secret generic "$KEYS_SECRET" --from-file=keys.yaml="$keys_dir/keys.yaml" \
    --dry-run=client -o yaml | k apply -f -
}
log "creating the client API keys Secret $KEYS_SECRET"
write_keys false

log "installing charts/iop as $RELEASE in namespace $NAMESPACE"
helm upgrade --install "$RELEASE" charts/iop \
  --kube-context "kind-$CLUSTER" --namespace "$NAMESPACE" \
  --set edge.auth.mode=required --set edge.auth.keysSecret="$KEYS_SECRET" \
  --set edge.image.repository=iop-edge --set-string edge.image.tag="$IMAGE_TAG" \
  --set edge.image.pullPolicy=Never \
  --set operator.image.repository=iop-operator --set-string operator.image.tag="$IMAGE_TAG" \
  --set operator.image.pullPolicy=Never \
  --set edge.replicaCount="$EDGE_REPLICAS" \
  --set edge.grpcService.type=NodePort --set edge.grpcService.nodePort="$GRPC_PORT" \
  --set edge.grpcService.publicUrl="https://localhost:$GRPC_PORT" \
  --set edge.service.type=NodePort --set edge.service.nodePort="$HTTP_NODE_PORT" \
  --set edge.logFormat=text \
  --set networkPolicy.enabled="$([[ $NETWORK_POLICY == 1 ]] && echo true || echo false)"
k rollout status "deployment/$OPERATOR" --timeout="${TIMEOUT}s"

log "applying examples/k8s/"
k apply -f examples/k8s/

# --- 4. rendered config, Edge rollout ------------------------------------------------
edge_config() { k get configmap "$CONFIG_MAP" -o jsonpath='{.data.edge\.yaml}' 2>/dev/null; }
config_has_providers() {
  edge_config | python3 -c 'import sys, yaml; c = yaml.safe_load(sys.stdin) or {}; sys.exit(0 if c.get("providers") else 1)' 2>/dev/null
}
log "waiting for the operator to render ConfigMap $CONFIG_MAP with the example providers"
wait_for "ConfigMap $CONFIG_MAP with providers" config_has_providers
wait_for "Secret $EDGE_TLS_SECRET" exists secret "$EDGE_TLS_SECRET"
# Ready: no node is connected yet, so each replica becomes Ready when its startup grace ends.
k rollout status "deployment/$EDGE" --timeout="${TIMEOUT}s"

# The Edge pods that are not terminating, sorted: the replicas the config must list.
edge_pods() {
  k get pods -l "$EDGE_SELECTOR" -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.metadata.deletionTimestamp}{"\n"}{end}' \
    | awk 'NF == 1 {print $1}' | sort
}
config_replicas() {
  edge_config | python3 -c 'import sys, yaml; print("\n".join(sorted((yaml.safe_load(sys.stdin) or {}).get("replicas") or [])))'
}
# The config's replicas are exactly the Edge pods, and there are EDGE_REPLICAS of them.
replicas_rendered() {
  local pods
  pods=$(edge_pods)
  [[ $(grep -c . <<<"$pods") == "$EDGE_REPLICAS" && $(config_replicas) == "$pods" ]]
}
log "waiting for the Edge config's replicas to list the $EDGE_REPLICAS Edge pods"
wait_for "replicas in ConfigMap $CONFIG_MAP equal to the Edge pods" replicas_rendered
mapfile -t EDGE_PODS < <(edge_pods)
echo "  replicas: ${EDGE_PODS[*]}"
edge_config >"$WORK/edge.yaml"

# The provider under test: id, node, base URL on the node, first public model name.
read -r PROVIDER NODE BASE_URL MODEL < <(python3 - "$WORK/edge.yaml" "$PROVIDER" <<'PY'
import sys, yaml
config = yaml.safe_load(open(sys.argv[1]))
wanted = sys.argv[2]
providers = config["providers"]
if wanted:
    providers = [p for p in providers if p["id"] == wanted]
else:
    # The mock speaks the whole Ollama API: prefer a normalized ollama provider.
    providers.sort(key=lambda p: (p["adapter"] != "ollama" or p.get("mode", "normalized") != "normalized"))
if not providers:
    sys.exit(f"provider {wanted!r} is not in the rendered Edge config")
p = providers[0]
print(p["id"], p["node"], p["target"]["base_url"], p["models"][0]["name"])
PY
) || die "could not read a provider from the rendered Edge config"
MOCK_ADDR=${BASE_URL#*://}
MOCK_ADDR=${MOCK_ADDR%%/*}
case $MOCK_ADDR in
  127.0.0.1:* | localhost:*) ;;
  *) die "provider $PROVIDER targets $BASE_URL; the mock runs on this host, so pick a provider on 127.0.0.1 (IOP_KIND_PROVIDER)" ;;
esac
log "testing provider $PROVIDER (node $NODE, model $MODEL, target $BASE_URL)"

# --- 5. node bundle ------------------------------------------------------------------
# As a user does (NOTES.txt): the node's Secret with kubectl, then `iop-operator node-bundle`.
NODE_SECRET=iop-node-$NODE
log "node bundle of $NODE: Secret $NODE_SECRET, then iop-operator node-bundle"
wait_for "Secret $NODE_SECRET" exists secret "$NODE_SECRET"
secret_dir=$WORK/bundle/secret
mkdir -p "$secret_dir"
chmod 0700 "$WORK/bundle" "$secret_dir"
for key in ca.pem node.pem node-key.pem; do
  k get secret "$NODE_SECRET" -o jsonpath="{.data.${key//./\\.}}" | base64 -d >"$secret_dir/$key"
  [[ -s $secret_dir/$key ]] || die "Secret $NODE_SECRET has no key $key"
done
# The node dials 127.0.0.1 (the published node port) and verifies a name on the Edge
# certificate: localhost (the chart adds the host of edge.grpcService.publicUrl), else the
# in-cluster Service name. -text, not -ext: LibreSSL (macOS) has no -ext.
k get secret "$EDGE_TLS_SECRET" -o jsonpath='{.data.edge\.pem}' | base64 -d >"$WORK/edge.pem"
mapfile -t edge_names < <(openssl x509 -in "$WORK/edge.pem" -noout -text | grep -o 'DNS:[^,[:space:]]*' | cut -d: -f2)
SERVER_NAME=
for name in localhost "$EDGE-grpc.$NAMESPACE.svc" "${edge_names[@]}"; do
  if printf '%s\n' "${edge_names[@]}" | grep -qx -- "$name"; then
    SERVER_NAME=$name
    break
  fi
done
[[ -n $SERVER_NAME ]] || die "the Edge certificate has no DNS name (SANs: ${edge_names[*]:-none})"
"$OPERATOR_BIN" node-bundle "$NODE" --edge-url "https://127.0.0.1:$GRPC_PORT" --server-name "$SERVER_NAME" \
  --ca "$secret_dir/ca.pem" --cert "$secret_dir/node.pem" --key "$secret_dir/node-key.pem" \
  --out "$WORK/bundle/$NODE"
NODE_CONFIG=$WORK/bundle/$NODE/node.yaml
[[ -s $NODE_CONFIG ]] || die "iop-operator node-bundle wrote no $NODE_CONFIG"

# --- 6. mock provider and node on this host -----------------------------------------
log "starting iop-mock-provider on $MOCK_ADDR and iop-node $NODE"
"$MOCK_BIN" --listen "$MOCK_ADDR" >"$WORK/mock-provider.log" 2>&1 &
MOCK_PID=$!
wait_for "the mock provider" curl -fsS -o /dev/null "http://$MOCK_ADDR/healthz"
"$NODE_BIN" --config "$NODE_CONFIG" >"$WORK/node.log" 2>&1 &
pids+=("$!")

# The client API through the HTTP API Service (published node port: any Ready replica), and
# each replica's own HTTP and admin API (/admin/v1/*, /metrics) through a port-forward to its
# pod. Not through k(): $! must be kubectl itself, not a subshell, so cleanup can stop it.
EDGE_URL=http://127.0.0.1:$HTTP_NODE_PORT
REPLICA_URLS=()
ADMIN_URLS=()
for i in "${!EDGE_PODS[@]}"; do
  kubectl --context "kind-$CLUSTER" -n "$NAMESPACE" port-forward "pod/${EDGE_PODS[i]}" \
    "$((HTTP_PORT + i)):8080" "$((ADMIN_PORT + i)):8081" >"$WORK/port-forward-$i.log" 2>&1 &
  pids+=("$!")
  REPLICA_URLS+=("http://127.0.0.1:$((HTTP_PORT + i))")
  ADMIN_URLS+=("http://127.0.0.1:$((ADMIN_PORT + i))")
done
wait_for "the Edge HTTP API through node port $HTTP_NODE_PORT" curl -fsS -o /dev/null "$EDGE_URL/healthz"
for i in "${!EDGE_PODS[@]}"; do
  wait_for "${EDGE_PODS[i]}'s admin API through port-forward" curl -fsS -o /dev/null "${ADMIN_URLS[i]}/healthz"
done

# dispatchable ADMIN_URL: the provider is dispatchable on that replica (its own session with
# the node is ready).
dispatchable() {
  curl -fsS "$1/admin/v1/providers" | python3 -c '
import json, sys
ids = {p["id"]: p for p in json.load(sys.stdin)["providers"]}
sys.exit(0 if ids.get(sys.argv[1], {}).get("dispatchable") else 1)' "$PROVIDER"
}
log "waiting for node $NODE to register with every replica and provider $PROVIDER to be dispatchable on each"
for i in "${!EDGE_PODS[@]}"; do
  wait_for "provider $PROVIDER dispatchable on ${EDGE_PODS[i]}" dispatchable "${ADMIN_URLS[i]}"
done

# cell KIND NAME COLUMN: the cell under COLUMN of the object NAME as `kubectl get KIND`
# prints it (an empty cell prints as <empty>, no such object as <missing>).
cell() {
  k get "$1" 2>/dev/null | python3 -c '
import re, sys
lines = sys.stdin.read().splitlines()
if not lines:
    sys.exit("kubectl get printed nothing")
cols = [(m.group(), m.start()) for m in re.finditer(r"\S+", lines[0])]
names = [name for name, _ in cols]
column = sys.argv[2]
if column not in names:
    sys.exit(f"kubectl get has no {column} column: " + lines[0])
i = names.index(column)
start, end = cols[i][1], (cols[i + 1][1] if i + 1 < len(cols) else None)
wanted = sys.argv[1]
# The object named like wanted (or its last segment, should the id be qualified).
for line in lines[1:]:
    name = line.split()[0]
    if wanted == name or wanted.endswith(("/" + name, "." + name)):
        print(line[start:end].strip() or "<empty>")
        sys.exit(0)
print("<missing>")' "$2" "$3"
}
last_replicas=
# node_replicas_are N/M: `kubectl get nodecatalogs` shows the node CONNECTED with REPLICAS N/M.
node_replicas_are() {
  local replicas connected
  replicas=$(cell nodecatalogs "$NODE" REPLICAS) || return 1
  connected=$(cell nodecatalogs "$NODE" CONNECTED) || return 1
  if [[ $replicas != "$last_replicas" ]]; then
    echo "  kubectl get nodecatalogs: $NODE CONNECTED=$connected REPLICAS=$replicas"
    last_replicas=$replicas
  fi
  [[ $replicas == "$1" && $connected == true ]]
}
log "waiting for kubectl get nodecatalogs to show $NODE connected to $EDGE_REPLICAS of $EDGE_REPLICAS replicas"
wait_for "$NODE REPLICAS $EDGE_REPLICAS/$EDGE_REPLICAS" node_replicas_are "$EDGE_REPLICAS/$EDGE_REPLICAS"
k get nodecatalogs

# --- 7. requests through the Edge, health available ----------------------------------
# chat STREAM [KEY] -> prints the HTTP status, body in $WORK/chat.out. KEY defaults to $KEY;
# an empty KEY sends no Authorization header. The key goes to curl on stdin (-H @-), so it
# never shows in the process list.
chat() {
  local key=${2-$KEY}
  printf '%s\n' "${key:+Authorization: Bearer $key}" \
    | curl -sS -o "$WORK/chat.out" -w '%{http_code}' --max-time 60 "$EDGE_URL/v1/chat/completions" \
      -H @- -H 'content-type: application/json' \
      -d "{\"model\":\"$MODEL\",\"stream\":$1,\"messages\":[{\"role\":\"user\",\"content\":\"hello from kind\"}]}" \
    || true
}
# get URL [KEY] -> prints the HTTP status of a GET (body in $WORK/get.out); no key by default.
get() {
  local key=${2-}
  printf '%s\n' "${key:+Authorization: Bearer $key}" \
    | curl -sS -o "$WORK/get.out" -w '%{http_code}' --max-time 30 -H @- "$1" || true
}
log "client authentication: no key, an unknown key, a key without the model"
status=$(chat false "")
[[ $status == 401 ]] || die "chat without a key returned HTTP $status, want 401: $(cat "$WORK/chat.out")"
status=$(chat false "iop-not-a-key-of-this-edge")
[[ $status == 401 ]] || die "chat with an unknown key returned HTTP $status, want 401: $(cat "$WORK/chat.out")"
status=$(chat false "$OTHER_KEY")
[[ $status == 403 ]] || die "chat with a key not allowed $MODEL returned HTTP $status, want 403: $(cat "$WORK/chat.out")"
status=$(get "$EDGE_URL/v1/models" "$KEY")
if [[ $status != 200 ]] || ! grep -q "\"$MODEL\"" "$WORK/get.out"; then
  die "GET /v1/models with the key: HTTP $status, want 200 listing $MODEL: $(cat "$WORK/get.out")"
fi

log "admin API and metrics: on the admin port, not on the HTTP API"
for path in /admin/v1/providers /metrics; do
  status=$(get "$EDGE_URL$path" "$KEY")
  [[ $status != 2* ]] || die "the HTTP API Service serves $path (HTTP $status); it belongs to the admin Service only"
done
log "chat request (JSON) through the Edge"
status=$(chat false)
[[ $status == 200 ]] || die "chat returned HTTP $status: $(cat "$WORK/chat.out")"
grep -q 'Hello from the IOP mock provider. You said: hello from kind' "$WORK/chat.out" \
  || die "unexpected chat answer: $(cat "$WORK/chat.out")"
log "chat request (SSE stream) through the Edge"
status=$(chat true)
[[ $status == 200 ]] || die "streamed chat returned HTTP $status: $(cat "$WORK/chat.out")"
grep -q '^data: \[DONE\]' "$WORK/chat.out" || die "the stream did not end with [DONE]: $(cat "$WORK/chat.out")"
log "chat request through each replica: any replica serves the node's provider"
for i in "${!EDGE_PODS[@]}"; do
  status=$(EDGE_URL=${REPLICA_URLS[i]} chat false)
  [[ $status == 200 ]] || die "chat through ${EDGE_PODS[i]} returned HTTP $status: $(cat "$WORK/chat.out")"
  # Each replica's /metrics (what the chart's ServiceMonitor scrapes, on the admin port)
  # counts its requests, per principal.
  status=$(get "${ADMIN_URLS[i]}/metrics")
  [[ $status == 200 ]] || die "GET /metrics on ${EDGE_PODS[i]}'s admin port returned HTTP $status"
  grep -q '^iop_edge_http_requests' "$WORK/get.out" || die "${EDGE_PODS[i]}'s /metrics has no iop_edge_http_requests"
  grep -q 'principal="kind-e2e"' "$WORK/get.out" || die "${EDGE_PODS[i]}'s /metrics does not count principal kind-e2e"
done

# HEALTH of the provider as `kubectl get providers` prints it.
provider_health() { cell providers "$PROVIDER" HEALTH; }
last_health=
health_is() { # health_is REGEX: the provider's HEALTH matches (case-insensitive)
  local health
  health=$(provider_health) || return 1
  if [[ $health != "$last_health" ]]; then
    echo "  kubectl get providers: $PROVIDER HEALTH=$health"
    last_health=$health
  fi
  [[ ${health,,} =~ $1 ]]
}
log "waiting for kubectl get providers to show $PROVIDER HEALTH available"
wait_for "$PROVIDER HEALTH available" health_is '^available$'
k get providers

# --- 8. rolling restart of the Edge under load: no request fails ----------------------
# Requests one after the other through the HTTP API Service (JSON and streamed in turn)
# until $WORK/load.stop exists; one line per request in $WORK/load.log: `ok`, or `fail
# STATUS` (the body is kept in $WORK/load-failed-N.out).
load_loop() {
  local i=0 stream status ok
  while [[ ! -e $WORK/load.stop ]]; do
    i=$((i + 1))
    stream=$([[ $((i % 2)) == 0 ]] && echo true || echo false)
    status=$(printf '%s\n' "Authorization: Bearer $KEY" \
      | curl -sS -o "$WORK/load.out" -w '%{http_code}' --max-time 60 "$EDGE_URL/v1/chat/completions" \
        -H @- -H 'content-type: application/json' \
        -d "{\"model\":\"$MODEL\",\"stream\":$stream,\"messages\":[{\"role\":\"user\",\"content\":\"hello from kind\"}]}" \
        2>>"$WORK/load-curl.log" || true)
    ok=0
    if [[ $status == 200 ]]; then
      if [[ $stream == true ]]; then
        grep -q '^data: \[DONE\]' "$WORK/load.out" && ok=1
      else
        grep -q 'You said: hello from kind' "$WORK/load.out" && ok=1
      fi
    fi
    if ((ok)); then
      echo ok >>"$WORK/load.log"
    else
      echo "fail $status" >>"$WORK/load.log"
      cp "$WORK/load.out" "$WORK/load-failed-$i.out" 2>/dev/null || true
    fi
    sleep 0.2
  done
}
load_count() {
  local n
  n=$(grep -c . "$WORK/load.log" 2>/dev/null) || true
  echo "${n:-0}"
}
load_at_least() { (($(load_count) >= $1)); }
# gone POD...: none of these pods exists any more (each drained and exited).
gone() {
  local pod
  for pod in "$@"; do
    ! exists pod "$pod" || return 1
  done
}
log "rolling restart of deployment/$EDGE while requests run through the HTTP API Service"
rm -f "$WORK/load.stop" "$WORK/load.log" "$WORK"/load-failed-*.out
load_loop &
LOAD_PID=$!
pids+=("$LOAD_PID")
wait_for "requests flowing before the restart" load_at_least 5
before=$(load_count)
k rollout restart "deployment/$EDGE"
k rollout status "deployment/$EDGE" --timeout="${TIMEOUT}s"
wait_for "the old Edge pods to drain and exit (${EDGE_PODS[*]})" gone "${EDGE_PODS[@]}"
wait_for "replicas in ConfigMap $CONFIG_MAP equal to the new Edge pods" replicas_rendered
mapfile -t new_pods < <(edge_pods)
echo "  replicas now: ${new_pods[*]}"
wait_for "$NODE REPLICAS $EDGE_REPLICAS/$EDGE_REPLICAS after the restart" \
  node_replicas_are "$EDGE_REPLICAS/$EDGE_REPLICAS"
# Some more requests on the new replicas only.
after=$(load_count)
wait_for "requests after the restart" load_at_least $((after + 10))
touch "$WORK/load.stop"
wait "$LOAD_PID" || true
total=$(load_count)
failed=$(grep -vc '^ok$' "$WORK/load.log" || true)
echo "  requests: $total ($((after - before)) during the restart), failed: $failed"
((after - before >= 5)) || die "too few requests ran during the rolling restart ($((after - before)))"
((failed == 0)) || die "$failed of $total requests failed during the rolling restart: $(grep -v '^ok$' "$WORK/load.log" | sort | uniq -c | tr '\n' ';') (bodies in ${WORK#"$ROOT"/}/load-failed-*.out)"
k get nodecatalogs

# --- 9. mock provider gone: health unavailable ---------------------------------------
log "stopping the mock provider"
kill "$MOCK_PID"
wait "$MOCK_PID" 2>/dev/null || true
MOCK_PID=
status=$(chat false)
[[ $status != 200 ]] || die "chat succeeded with the mock provider stopped"
echo "  chat with the provider down: HTTP $status"
# Traffic goes on while we wait (a failed run is health evidence too, besides the node's probes).
last_chat=$SECONDS
unhealthy() {
  if ((SECONDS - last_chat >= 10)); then
    chat false >/dev/null
    last_chat=$SECONDS
  fi
  health_is '^unavailable$'
}
log "waiting for kubectl get providers to show $PROVIDER HEALTH unavailable"
wait_for "$PROVIDER HEALTH unavailable" unhealthy
k get providers

# --- 10. key disabled in the Secret: refused without a restart ------------------------
# The keys Secret is mounted without subPath: the kubelet updates the file (within about a
# minute, on each replica on its own) and the Edge reloads it.
log "disabling principal kind-e2e in Secret $KEYS_SECRET"
pod_restarts() {
  k get pods -l "$EDGE_SELECTOR" \
    -o jsonpath='{range .items[*]}{.metadata.name}={.status.containerStatuses[0].restartCount}{" "}{end}'
}
edge_pods_before=$(pod_restarts)
write_keys true
# Refused by every replica: the Service balances over them, so several answers in a row.
key_refused() {
  local i
  for i in 1 2 3 4 5 6 7 8; do
    [[ $(get "$EDGE_URL/v1/models" "$KEY") == 401 ]] || return 1
  done
}
wait_for "every Edge replica to refuse the disabled key" key_refused
[[ $(get "$EDGE_URL/v1/models" "$OTHER_KEY") == 200 ]] || die "the Edge refuses the other, still enabled, key too"
# Same pods, same restart counts: the change was reloaded, not restarted into.
now=$(pod_restarts)
[[ $now == "$edge_pods_before" ]] || die "the Edge pods restarted or were replaced (before: $edge_pods_before; after: $now)"

log "PASS: kind e2e ($EDGE_REPLICAS Edge replicas, the node on each; chat through the Edge with an API key; $total requests through a rolling restart, none failed; $PROVIDER available, then unavailable; key revoked live)"
