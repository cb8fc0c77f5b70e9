#!/usr/bin/env python3
"""Validates rendered Kubernetes manifests (multi-document YAML on stdin).

1. Every object against the Kubernetes JSON schema of --kubernetes-version, strictly
   (kubernetes-validate, as a library). A kind it has no schema for fails, except the
   CRD-typed kinds listed in CRD_SCHEMAS (ServiceMonitor, PrometheusRule), which are
   checked against the schema here.
2. What a schema cannot see: selectors that match no pods, ports that do not exist,
   ServiceAccounts and Roles that are not rendered, pods that hold an API token without
   needing one, containers outside the restricted Pod Security Standard, RBAC rights
   beyond exactly what the operator calls (OPERATOR_RULES), and the operator's view of
   the Edge (IOP_EDGE_POD_SELECTOR selects exactly the Edge's pods, whose container port
   `admin` is EDGE_ADMIN_PORT; IOP_EDGE_AUTH_MODE matches whether the keys Secret is
   mounted at EDGE_KEYS_DIR), dashboard ConfigMaps whose
   `*.json` keys are not JSON, PrometheusRule groups named twice, and a table of the
   operator's rights in docs/kubernetes.md that says other than OPERATOR_RULES.

Used by scripts/chart-check; needs kubernetes-validate (which brings PyYAML and jsonschema).
"""

import argparse
import json
import pathlib
import re
import sys

import jsonschema
import yaml
from kubernetes_validate import utils as kv

# The fields of monitoring.coreos.com/v1 ServiceMonitor the chart uses (from the Prometheus
# Operator API); unknown fields fail, like kubernetes-validate --strict.
_RELABEL = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "action": {"type": "string"},
        "modulus": {"type": "integer"},
        "regex": {"type": "string"},
        "replacement": {"type": "string"},
        "separator": {"type": "string"},
        "sourceLabels": {"type": "array", "items": {"type": "string"}},
        "targetLabel": {"type": "string"},
    },
}
_DURATION = {"type": "string", "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"}
_LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array", "items": {"type": "object"}},
    },
}
SERVICE_MONITOR = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {
            "type": "object",
            "required": ["name"],
            "properties": {
                "name": {"type": "string"},
                "namespace": {"type": "string"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
            },
        },
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "jobLabel": {"type": "string"},
                "selector": _LABEL_SELECTOR,
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["integer", "string"]},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
                            "interval": _DURATION,
                            "scrapeTimeout": _DURATION,
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {"type": "array", "items": _RELABEL},
                            "metricRelabelings": {"type": "array", "items": _RELABEL},
                        },
                    },
                },
            },
        },
    },
}
# The fields of monitoring.coreos.com/v1 PrometheusRule (Prometheus Operator API); unknown
# fields fail. The expressions themselves are checked by scripts/check-observability (promtool).
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["expr"],
    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
    "properties": {
        "alert": {"type": "string", "minLength": 1},
        "record": {"type": "string", "minLength": 1},
        "expr": {"type": ["string", "integer"], "minLength": 1},
        "for": _DURATION,
        "keep_firing_for": _DURATION,
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
}
PROMETHEUS_RULE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": SERVICE_MONITOR["properties"]["metadata"],
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": _DURATION,
                            "query_offset": _DURATION,
                            "limit": {"type": "integer"},
                            "partial_response_strategy": {"type": "string"},
                            "labels": _STRING_MAP,
                            "rules": {"type": "array", "items": _RULE},
                        },
                    },
                },
            },
        },
    },
}
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): SERVICE_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
}

# Where the operator's rendered Edge config reads the keys file (operator/src/reconcile/mod.rs
# EDGE_KEYS_FILE) when IOP_EDGE_AUTH_MODE is `required` (its default).
EDGE_KEYS_DIR = "/etc/iop/keys"
# The admin listener the operator renders into the Edge config and reads at every Edge pod's
# IP (operator/src/env.rs EDGE_ADMIN_LISTEN).
EDGE_ADMIN_PORT = 8081

# Every (apiGroup, resource, resourceName or None, verb) the operator's Roles may grant:
# exactly what operator/src/runtime/ calls (least privilege; charts/iop/templates/rbac.yaml
# explains each). A rendered rule outside this set, or a call missing from the rules, fails.
_IOP = "iop.dev"
OPERATOR_RULES = {
    # controller.rs: list + watch of each kind (reflectors); namespace.rs: the finalizer (merge patch).
    (_IOP, "providers", None, "list"),
    (_IOP, "providers", None, "watch"),
    (_IOP, "workspacetemplates", None, "list"),
    (_IOP, "workspacetemplates", None, "watch"),
    (_IOP, "nodecatalogs", None, "list"),
    (_IOP, "nodecatalogs", None, "watch"),
    (_IOP, "nodecatalogs", None, "patch"),
    # namespace.rs apply_status: server-side apply on the status subresource (all writers).
    (_IOP, "providers/status", None, "patch"),
    (_IOP, "nodecatalogs/status", None, "patch"),
    (_IOP, "workspacetemplates/status", None, "patch"),
    # namespace.rs apply: server-side apply of iop-edge-config (creating it is authorized as
    # create, which cannot be limited by name); controller.rs: its metadata watch by name.
    ("", "configmaps", None, "create"),
    ("", "configmaps", "iop-edge-config", "patch"),
    ("", "configmaps", "iop-edge-config", "list"),
    ("", "configmaps", "iop-edge-config", "watch"),
    # pki.rs: get the CA / Edge / node Secrets, create the CA, server-side apply the others.
    ("", "secrets", None, "get"),
    ("", "secrets", None, "create"),
    ("", "secrets", None, "patch"),
    # controller.rs: list + watch of Secrets' metadata, label- or name-selected (a rotated
    # credential, a deleted node Secret or a replaced CA reconciles); RBAC cannot limit by label.
    ("", "secrets", None, "list"),
    ("", "secrets", None, "watch"),
    # controller.rs: list + watch of the Edge pods (IOP_EDGE_POD_SELECTOR): the config's
    # replicas and where the status mirror reads each replica's admin API.
    ("", "pods", None, "list"),
    ("", "pods", None, "watch"),
    # leader.rs: get and replace (update) the Lease by name; create it (not limitable by name).
    ("coordination.k8s.io", "leases", "iop-operator-leader", "get"),
    ("coordination.k8s.io", "leases", None, "create"),
    ("coordination.k8s.io", "leases", "iop-operator-leader", "update"),
    # crds.rs: get each IOP CRD by name.
    ("apiextensions.k8s.io", "customresourcedefinitions", "providers.iop.dev", "get"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "nodecatalogs.iop.dev", "get"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "workspacetemplates.iop.dev", "get"),
    # controller.rs: watch of its own Namespace by name; ownership.rs: get it (its uid, and
    # whether it is terminating at shutdown). The rendered namespace is `iop`.
    ("", "namespaces", "iop", "get"),
    ("", "namespaces", "iop", "list"),
    ("", "namespaces", "iop", "watch"),
    # ownership.rs: its ClusterRole and ClusterRoleBinding, owned by the Namespace.
    ("rbac.authorization.k8s.io", "clusterroles", "iop-iop-operator", "get"),
    ("rbac.authorization.k8s.io", "clusterroles", "iop-iop-operator", "patch"),
    ("rbac.authorization.k8s.io", "clusterrolebindings", "iop-iop-operator", "get"),
    ("rbac.authorization.k8s.io", "clusterrolebindings", "iop-iop-operator", "patch"),
}


def granted(role):
    """The (apiGroup, resource, resourceName or None, verb) tuples of a Role or ClusterRole."""
    out = set()
    for rule in role.get("rules", []):
        names = rule.get("resourceNames") or [None]
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for name in names:
                    for verb in rule.get("verbs", []):
                        out.add((group, resource, name, verb))
    return out


def name_of(obj):
    return f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"


def matches(selector, labels):
    """A matchLabels selector (the only form the chart uses) against a label set."""
    if not selector:
        return False
    if set(selector) - {"matchLabels"} and "matchLabels" in selector:
        raise ValueError(f"unsupported selector {selector}")
    wanted = selector.get("matchLabels", selector)
    return all(labels.get(k) == v for k, v in wanted.items())


def check(objects, version):
    errors = []

    def fail(obj, message):
        errors.append(f"{name_of(obj)}: {message}")

    by_kind = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
        try:
            kv.validate(obj, version, True)
        except kv.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            fail(obj, f"schema (Kubernetes {e.version}): {path}: {e.message}")
        except kv.SchemaNotFoundError:
            schema = CRD_SCHEMAS.get((obj["apiVersion"], obj["kind"]))
            if schema is None:
                fail(obj, f"no schema for {obj['apiVersion']} {obj['kind']} (add it to CRD_SCHEMAS)")
                continue
            for e in jsonschema.Draft202012Validator(schema).iter_errors(obj):
                fail(obj, f"schema (CRD): {'.'.join(str(p) for p in e.path)}: {e.message}")

    deployments = by_kind.get("Deployment", [])
    accounts = {o["metadata"]["name"]: o for o in by_kind.get("ServiceAccount", [])}
    roles = {(o["kind"], o["metadata"]["name"]) for o in by_kind.get("Role", []) + by_kind.get("ClusterRole", [])}
    bound_accounts = set()
    for binding in by_kind.get("RoleBinding", []) + by_kind.get("ClusterRoleBinding", []):
        ref = binding["roleRef"]
        if (ref["kind"], ref["name"]) not in roles:
            fail(binding, f"roleRef {ref['kind']}/{ref['name']} is not rendered")
        for subject in binding.get("subjects", []):
            if subject["kind"] == "ServiceAccount":
                bound_accounts.add(subject["name"])
                if subject["name"] not in accounts:
                    fail(binding, f"subject ServiceAccount/{subject['name']} is not rendered")

    rbac = by_kind.get("Role", []) + by_kind.get("ClusterRole", [])
    if rbac:
        rights = set()
        for role in rbac:
            for right in sorted(granted(role), key=str):
                rights.add(right)
                if "*" in right:
                    fail(role, f"grants a wildcard: {right}")
                elif right not in OPERATOR_RULES:
                    fail(role, f"grants {right}, which the operator never uses (least privilege)")
        for right in sorted(OPERATOR_RULES - rights, key=str):
            fail(rbac[0], f"lacks {right}, which the operator uses")

    def pods_matching(selector):
        return [d for d in deployments if matches(selector, d["spec"]["template"]["metadata"].get("labels", {}))]

    def container_ports(deployment):
        return {
            p.get("name"): p["containerPort"]
            for c in deployment["spec"]["template"]["spec"]["containers"]
            for p in c.get("ports", [])
        }

    for d in deployments:
        template = d["spec"]["template"]
        pod = template["spec"]
        if not matches(d["spec"]["selector"], template["metadata"].get("labels", {})):
            fail(d, "spec.selector does not match the pod template labels")
        account = pod.get("serviceAccountName", "default")
        if account not in accounts:
            fail(d, f"serviceAccountName {account} is not rendered")
        elif account not in bound_accounts:
            sa_mounts = accounts[account].get("automountServiceAccountToken", True)
            if pod.get("automountServiceAccountToken", sa_mounts) is not False:
                fail(d, "has no API rights but mounts a ServiceAccount token")
        psc = pod.get("securityContext", {})
        if psc.get("seccompProfile", {}).get("type") != "RuntimeDefault":
            fail(d, "pod seccompProfile is not RuntimeDefault")
        volumes = {v["name"] for v in pod.get("volumes", [])}
        for c in pod.get("initContainers", []) + pod["containers"]:
            sc = c.get("securityContext", {})
            if not (sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True):
                fail(d, f"container {c['name']}: runAsNonRoot is not true")
            if sc.get("allowPrivilegeEscalation") is not False:
                fail(d, f"container {c['name']}: allowPrivilegeEscalation is not false")
            if sc.get("readOnlyRootFilesystem") is not True:
                fail(d, f"container {c['name']}: readOnlyRootFilesystem is not true")
            if "ALL" not in sc.get("capabilities", {}).get("drop", []):
                fail(d, f"container {c['name']}: capabilities do not drop ALL")
            if sc.get("privileged"):
                fail(d, f"container {c['name']}: privileged")
            if not c.get("resources", {}).get("requests"):
                fail(d, f"container {c['name']}: no resource requests")
            image = c.get("image", "")
            if ":" not in image.rsplit("/", 1)[-1] or image.endswith(":"):
                fail(d, f"container {c['name']}: image {image!r} has no tag")
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    fail(d, f"container {c['name']}: volumeMount {m['name']} has no volume")
            names = {p.get("name") for p in c.get("ports", [])}
            if "http" in names and not (c.get("livenessProbe") and c.get("readinessProbe")):
                fail(d, f"container {c['name']}: serves http without liveness and readiness probes")

    services = by_kind.get("Service", [])
    for s in services:
        targets = pods_matching({"matchLabels": s["spec"].get("selector", {})})
        if len(targets) != 1:
            fail(s, f"selector matches {len(targets)} Deployments, want 1")
            continue
        ports = container_ports(targets[0])
        for p in s["spec"]["ports"]:
            target = p.get("targetPort", p["port"])
            if isinstance(target, str) and target not in ports:
                fail(s, f"targetPort {target} is not a container port of {name_of(targets[0])}")
            if isinstance(target, int) and target not in ports.values():
                fail(s, f"targetPort {target} is not a container port of {name_of(targets[0])}")
            if "nodePort" in p and s["spec"].get("type") not in ("NodePort", "LoadBalancer"):
                fail(s, "nodePort on a Service that is not NodePort/LoadBalancer")

    # The operator's env against the rendered Edge: the pod selector selects exactly the Edge
    # Deployment's pods (the config's replicas; each one's admin API is read at its pod IP on
    # EDGE_ADMIN_PORT, which must be its container port `admin`), and the auth mode it
    # renders matches whether the keys Secret is mounted where the config says.
    for d in deployments:
        for c in d["spec"]["template"]["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            selector = env.get("IOP_EDGE_POD_SELECTOR")
            if selector is None:
                if "IOP_NAMESPACE" in {e["name"] for e in c.get("env", [])}:
                    fail(d, "the operator has no IOP_EDGE_POD_SELECTOR")
                continue
            terms = [t.split("=", 1) for t in (selector or "").split(",")]
            if not selector or any(len(t) != 2 or not t[0] for t in terms):
                fail(d, f"IOP_EDGE_POD_SELECTOR {selector!r} is not KEY=VALUE[,KEY=VALUE...]")
                continue
            edges = pods_matching({"matchLabels": dict(terms)})
            if len(edges) != 1:
                fail(d, f"IOP_EDGE_POD_SELECTOR {selector!r} matches {len(edges)} Deployments, want the Edge alone")
                continue
            admin_port = container_ports(edges[0]).get("admin")
            if admin_port != EDGE_ADMIN_PORT:
                fail(d, f"{name_of(edges[0])} has container port admin {admin_port}, but the operator reads each Edge pod's admin API on {EDGE_ADMIN_PORT}")
            mode = env.get("IOP_EDGE_AUTH_MODE") or "required"
            if mode not in ("required", "disabled"):
                fail(d, f"IOP_EDGE_AUTH_MODE {mode!r} is not `required` or `disabled`")
            mounted = any(
                mount["mountPath"].rstrip("/") == EDGE_KEYS_DIR
                for ec in edges[0]["spec"]["template"]["spec"]["containers"]
                for mount in ec.get("volumeMounts", [])
            )
            if (mode == "required") != mounted:
                fail(edges[0], f"IOP_EDGE_AUTH_MODE is {mode} but the keys Secret is {'' if mounted else 'not '}mounted at {EDGE_KEYS_DIR}")

    for pdb in by_kind.get("PodDisruptionBudget", []):
        if not pods_matching(pdb["spec"]["selector"]):
            fail(pdb, "selector matches no Deployment")

    for np in by_kind.get("NetworkPolicy", []):
        targets = pods_matching(np["spec"]["podSelector"])
        if not targets:
            fail(np, "podSelector matches no Deployment")
            continue
        ports = container_ports(targets[0])
        for rule in np["spec"].get("ingress", []):
            for p in rule.get("ports", []):
                if isinstance(p.get("port"), str) and p["port"] not in ports:
                    fail(np, f"ingress port {p['port']} is not a container port")
            for peer in rule.get("from", []):
                if set(peer) == {"podSelector"} and not pods_matching(peer["podSelector"]):
                    fail(np, f"ingress peer {peer} matches no Deployment")
        for rule in np["spec"].get("egress", []):
            for peer in rule.get("to", []):
                if set(peer) == {"podSelector"} and not pods_matching(peer["podSelector"]):
                    fail(np, f"egress peer {peer} matches no Deployment")

    for sm in by_kind.get("ServiceMonitor", []):
        selected = [s for s in services if matches(sm["spec"]["selector"], s["metadata"].get("labels", {}))]
        if len(selected) != 1:
            fail(sm, f"selector matches {len(selected)} Services, want 1")
            continue
        port_names = {p.get("name") for p in selected[0]["spec"]["ports"]}
        for e in sm["spec"]["endpoints"]:
            if e.get("port") not in port_names:
                fail(sm, f"endpoint port {e.get('port')} is not a port of {name_of(selected[0])}")

    # Dashboards for the Grafana sidecar: every `*.json` key of a ConfigMap is a JSON object.
    for cm in by_kind.get("ConfigMap", []):
        for key, text in (cm.get("data") or {}).items():
            if key.endswith(".json"):
                try:
                    if not isinstance(json.loads(text), dict):
                        fail(cm, f"data.{key} is not a JSON object")
                except ValueError as e:
                    fail(cm, f"data.{key} is not JSON: {e}")

    # Rule names are unique within a group (Prometheus refuses duplicates in a rule file).
    for pr in by_kind.get("PrometheusRule", []):
        names = [g.get("name") for g in pr["spec"].get("groups", [])]
        for dup in sorted({n for n in names if names.count(n) > 1}):
            fail(pr, f"group {dup} appears twice")

    return errors, by_kind


# docs/kubernetes.md's table of the operator's rights (for `rbac.create: false`), which must
# say exactly OPERATOR_RULES' (resource, verb) pairs.
RIGHTS_DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "kubernetes.md"
RIGHTS_TABLE_HEADER = "| in the release namespace | verbs |"
VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}


def documented_rights_errors():
    """Differences between the rights table in RIGHTS_DOC and OPERATOR_RULES."""
    lines = RIGHTS_DOC.read_text().splitlines()
    if RIGHTS_TABLE_HEADER not in lines:
        return [f"{RIGHTS_DOC.name}: the operator's rights table ({RIGHTS_TABLE_HEADER}) is missing"]
    resources = {resource for _, resource, _, _ in OPERATOR_RULES}
    documented = set()
    for line in lines[lines.index(RIGHTS_TABLE_HEADER) + 2 :]:
        if not line.startswith("|"):
            break
        what, verbs = line.strip("|").split("|")
        named = [r for r in re.findall(r"`([^`]+)`", what) if r in resources]
        said = {v for v in re.findall(r"[a-z]+", verbs) if v in VERBS}
        documented |= {(r, v) for r in named for v in said}
    expected = {(resource, verb) for _, resource, _, verb in OPERATOR_RULES}
    return [f"{RIGHTS_DOC.name}: the operator's rights table lacks {r} {v}" for r, v in sorted(expected - documented)] + [
        f"{RIGHTS_DOC.name}: the operator's rights table grants {r} {v}, which the operator does not call"
        for r, v in sorted(documented - expected)
    ]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubernetes-version", required=True)
    parser.add_argument("--require-kind", action="append", default=[])
    parser.add_argument("--forbid-kind", action="append", default=[])
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()

    objects = [o for o in yaml.safe_load_all(sys.stdin) if o]
    errors, by_kind = check(objects, args.kubernetes_version)
    errors += documented_rights_errors()
    for kind in args.require_kind:
        if kind not in by_kind:
            errors.append(f"no {kind} was rendered")
    for kind in args.forbid_kind:
        if kind in by_kind:
            errors.append(f"a {kind} was rendered")
    for e in errors:
        print(f"ERROR {e}", file=sys.stderr)
    if errors:
        return 1
    if not args.quiet:
        kinds = ", ".join(f"{k} {len(v)}" for k, v in sorted(by_kind.items()))
        print(f"validate-manifests: {len(objects)} objects ok against Kubernetes {args.kubernetes_version} ({kinds})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
