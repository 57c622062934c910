"""Static checks of the examples that need a parser, called by examples/check.sh.

  checks.py grafana DASHBOARD OUT_RULES   structure of the dashboard; writes every panel
                                          expression as a recording rule for promtool to parse
  checks.py kubernetes DIR README         PodMonitor shape, and the manifests agreeing with each
                                          other and with README (needs PyYAML)
  checks.py switch-yaml CONFIGMAP OUT     extracts switch.yaml from the ConfigMap

Prints nothing and exits 0 when fine; otherwise prints each problem and exits 1.
"""
import json
import re
import sys

problems = []


def problem(msg):
    problems.append(msg)


def grafana(path, out):
    d = json.load(open(path))
    names = [v.get("name") for v in d.get("templating", {}).get("list", [])]
    if "datasource" not in names:
        problem("no `datasource` variable: the dashboard must not hard-code a Prometheus")
    exprs = []
    for p in d.get("panels", []):
        title = p.get("title", "?")
        if p.get("datasource", {}).get("uid") != "${datasource}":
            problem(f"panel {title!r}: datasource is not ${{datasource}}")
        targets = p.get("targets", [])
        if not targets:
            problem(f"panel {title!r}: no targets")
        for t in targets:
            e = t.get("expr", "")
            if not e:
                problem(f"panel {title!r}: a target without expr")
            exprs.append((title, e))
    # Grafana's variables are not PromQL: give promtool what Grafana would send.
    with open(out, "w") as f:
        f.write("groups:\n  - name: dashboard\n    rules:\n")
        for i, (title, e) in enumerate(exprs):
            e = e.replace("$__rate_interval", "5m").replace("$instance", ".*")
            f.write(f"      - record: dashboard:panel_{i}\n        expr: {json.dumps(e)}\n")


def kubernetes(d, readme):
    import yaml

    ds = yaml.safe_load(open(f"{d}/daemonset.yaml"))
    cm = yaml.safe_load(open(f"{d}/configmap.yaml"))
    pm = yaml.safe_load(open(f"{d}/podmonitor.yaml"))
    if pm.get("apiVersion") != "monitoring.coreos.com/v1" or pm.get("kind") != "PodMonitor":
        problem("podmonitor.yaml is not a monitoring.coreos.com/v1 PodMonitor")
    pod = ds["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    if not pod["spec"].get("hostNetwork"):
        problem("daemonset: hostNetwork is not true")
    # The capabilities: README's Least privilege table, without the CAP_ prefix.
    sec = readme.split("## Least privilege", 1)[1].split("\n## ", 1)[0]
    want = sorted(m.upper() for m in re.findall(r"^\| `cap_([a-z_]+)`", sec, re.M))
    caps = c["securityContext"]["capabilities"]
    if sorted(caps.get("add", [])) != want or caps.get("drop") != ["ALL"]:
        problem(f"daemonset capabilities {caps} are not drop [ALL] + add {want} (README)")
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    for probe in ("readinessProbe", "livenessProbe"):
        g = c.get(probe, {}).get("httpGet", {})
        if g.get("path") != "/healthz" or g.get("port") not in ports:
            problem(f"daemonset {probe} is not httpGet /healthz on a named container port")
    switch = yaml.safe_load(cm["data"]["switch.yaml"])
    listen = switch.get("metrics", {}).get("listen", "127.0.0.1:9187")
    if int(listen.rsplit(":", 1)[1]) != ports.get("metrics"):
        problem(f"configmap metrics.listen {listen} is not the container port `metrics` {ports.get('metrics')}")
    mounts = {v["name"]: v["mountPath"] for v in c.get("volumeMounts", [])}
    vols = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    cfg = [n for n, v in vols.items() if v.get("configMap", {}).get("name") == cm["metadata"]["name"]]
    if not cfg or mounts.get(cfg[0]) + "/switch.yaml" not in c.get("args", []):
        problem("daemonset does not run the ConfigMap's switch.yaml")
    sel = pm["spec"]["selector"]["matchLabels"]
    labels = pod["metadata"]["labels"]
    if any(labels.get(k) != v for k, v in sel.items()):
        problem(f"podmonitor selector {sel} does not match the daemonset's pod labels {labels}")
    for ep in pm["spec"]["podMetricsEndpoints"]:
        if ep.get("port") not in ports or ep.get("path", "/metrics") != "/metrics":
            problem(f"podmonitor endpoint {ep} is not /metrics on a named container port")
    if pm["metadata"].get("namespace") != ds["metadata"].get("namespace"):
        problem("podmonitor and daemonset are in different namespaces")


def switch_yaml(cm_path, out):
    import yaml

    open(out, "w").write(yaml.safe_load(open(cm_path))["data"]["switch.yaml"])


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "grafana":
        grafana(sys.argv[2], sys.argv[3])
    elif what == "kubernetes":
        kubernetes(sys.argv[2], open(sys.argv[3]).read())
    elif what == "switch-yaml":
        switch_yaml(sys.argv[2], sys.argv[3])
    else:
        sys.exit(f"unknown check {what}")
    for p in problems:
        print(p)
    sys.exit(1 if problems else 0)
