#!/usr/bin/env python3
"""Checks the layering of docs/design-decisions.md ("Layers"): no upward include, no cycle.

1. Includes: every quoted #include of every C++/CUDA file under the checked folders must name a
   module its folder may use (the table below) or a file next to it. An include of a lower
   module's header is fine; an upward one fails.
2. Targets (with --graphviz FILE, the output of `cmake --graphviz=FILE`): the link graph of
   mla's own targets must be acyclic and every library edge must point down the layer order.

Exit status 0 when both hold; otherwise every offending include or edge is printed.
"""
import argparse
import os
import re
import sys

# Folder -> the include prefixes it may use ("mla/x.h" public headers are listed by name where a
# layer may see only some of them). Tests and benchmarks of internals (tests/, bench/*.cc) are
# white-box and may include src/; they are not checked here.
PUBLIC_LOW = ["mla/types.h", "mla/status.h", "mla/tensor.h", "mla/memory.h", "mla/batch.h",
              "mla/forward_method.h",
              "mla/kv_pool.h", "mla/model.h", "mla/ops.h", "mla/workspace.h",
              "mla/fault_injection.h", "mla/upload_staging.h", "mla/gpu_support.h"]
PUBLIC_ALL = ["mla/"]
RULES = {
    "include/mla": PUBLIC_ALL,  # public headers (checked by name below)
    "src/core": PUBLIC_LOW + ["core/"],
    "src/planning": PUBLIC_LOW + ["core/", "planning/"],
    "src/kernels/cpu": PUBLIC_LOW + ["core/", "kernels/cpu/"],
    "src/kernels/cuda": PUBLIC_LOW + ["core/", "kernels/cuda/"],
    "src/backends": PUBLIC_ALL + ["core/", "planning/", "backends/"],
    "src/layer": PUBLIC_ALL + ["core/", "planning/", "backends/", "layer/"],
    "lib/conformance": PUBLIC_ALL + ["conformance/"],
    "lib/sim": PUBLIC_ALL + ["conformance/", "sim/"],
    "bench/support": PUBLIC_ALL,
    "tools/mla": PUBLIC_ALL + ["conformance/", "sim/", "mla_version.h", "bench_prefill.h",
                               "bench_cuda.h", "fill.h", "ceilings.h"],
    "python/csrc": PUBLIC_ALL,
}
# Public headers of the upper layers (the backend interface and the layer): lower public headers
# never include them.
PUBLIC_UPPER = {"mla/backend.h", "mla/layer.h", "mla/mla.h", "mla/engine_planner.h"}

# mla's own targets, lowest first; a library may link only targets before it in this list.
TARGET_ORDER = ["mla_core", "mla_planning", "mla_cuda_plan", "mla_cpu_ops", "mla_cuda", "mla",
                "mla_conformance", "mla_sim", "mla_bench_support"]

INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
SOURCE_EXT = (".h", ".cc", ".cu", ".cuh")


def allowed(folder, path, inc):
    if os.path.exists(os.path.join(os.path.dirname(path), inc)):
        return True  # a file next to it
    return any(inc == p or (p.endswith("/") and inc.startswith(p)) for p in RULES[folder])


def check_includes(root):
    bad = []
    for folder in RULES:
        base = os.path.join(root, folder)
        for dirpath, _, files in os.walk(base):
            for f in files:
                if not f.endswith(SOURCE_EXT):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                for inc in INCLUDE_RE.findall(text):
                    if folder == "include/mla" and inc in PUBLIC_UPPER and \
                            "mla/" + f not in PUBLIC_UPPER:
                        bad.append(f"{rel}: includes {inc} (a lower public header includes the "
                                   "backend/layer interface)")
                    elif not allowed(folder, path, inc):
                        bad.append(f"{rel}: includes \"{inc}\", which {folder} may not use")
    return bad


def check_graph(dot_path):
    names, edges = {}, []
    node_re = re.compile(r'^\s*"(node\d+)"\s*\[\s*label\s*=\s*"([^"]+)"')
    edge_re = re.compile(r'^\s*"(node\d+)"\s*->\s*"(node\d+)"')
    with open(dot_path, encoding="utf-8") as fh:
        for line in fh:
            m = node_re.match(line)
            if m:
                names[m.group(1)] = m.group(2)
                continue
            m = edge_re.match(line)
            if m:
                edges.append((m.group(1), m.group(2)))
    rank = {t: i for i, t in enumerate(TARGET_ORDER)}
    bad = []
    graph = {}
    for a, b in edges:
        na, nb = names.get(a, a), names.get(b, b)
        if na == nb:
            continue  # gtest_discover_tests' post-build step shows as a self-edge
        graph.setdefault(na, set()).add(nb)
        if na in rank and nb in rank and rank[nb] >= rank[na]:
            bad.append(f"target {na} links {nb}, which is not below it")
    # Cycles among all targets (Tarjan would do; the graph is small: plain DFS with colours).
    colour = {}

    def visit(n, stack):
        colour[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if colour.get(m) == 1:
                bad.append("cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            elif m not in colour:
                visit(m, stack)
        stack.pop()
        colour[n] = 2

    for n in sorted(graph):
        if n not in colour:
            visit(n, [])
    if not any(n in rank for n in names.values()):
        bad.append(f"{dot_path}: none of mla's targets found (is it cmake --graphviz output?)")
    return bad


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap.add_argument("--graphviz", help="the main file written by cmake --graphviz=FILE")
    args = ap.parse_args()
    bad = check_includes(args.root)
    if args.graphviz:
        bad += check_graph(args.graphviz)
    for b in bad:
        print(b)
    print(f"check-layers: {'FAILED, ' + str(len(bad)) + ' problem(s)' if bad else 'ok'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
