"""How deep into the closed form's ranking must the simulator look? (the default of
`plan --simulate-top`)

    python benchmarks/rerank_depth.py [--limit 400] [--json out.json]

For every shipped config (configs/*.yaml) and the search-time clusters of
benchmarks/search_time.py (AMP's 16x16 mix and 2048 H100 + A100 GPUs), it ranks every feasible
strategy by the closed form (`plan(spec, simulate_top=0)`), simulates the first --limit of them
(`amp_search.simulate.with_simulation`), orders those by simulated time (`ranking_key`) and
reports, for the simulated best 1, 3 and 10: the deepest closed-form rank they come from. A
default N at or above those depths re-ranks as well as simulating everything would (within
the limit). Also the mean time per simulation.

`--parts`: also every part of each mixed cluster that `plan --subsets` searches
(`amp_search.planner.cluster_subsets`, each planned as `plan_on_subset` does), whose best
plan alone is used: the depth of their simulated best against
`amp_search.planner.BEST_ONLY_SIMULATE_TOP`, the re-rank depth of those searches.

A benchmark: it reads the command line; the library code it calls does not.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from amp_search.measurements import load_measurements  # noqa: E402
from amp_search.placement import device_orders  # noqa: E402
from amp_search.costing import CostModel  # noqa: E402
from amp_search.planner import (BEST_ONLY_SIMULATE_TOP, NoFeasibleStrategy,  # noqa: E402
                                cluster_subsets, plan, ranking_key, subset_spec)
from amp_search.resources import profiles_dir  # noqa: E402
from amp_search.simulate import DEFAULT_SIMULATE_TOP, with_simulation  # noqa: E402
from amp_search.spec import load_spec, parse_spec  # noqa: E402
from search_time import big_mixed, gpt2_mixed  # noqa: E402


def depth(spec, limit: int) -> dict:
    measurements = load_measurements(spec, profiles_dir())
    p = plan(spec, measurements=measurements, simulate_top=0, keep=None)
    model = CostModel(spec, measurements=measurements)
    orders = {o.name: o for o in device_orders(spec.cluster, spec.training.precision)}
    head = list(p.strategies[:limit])
    t0 = time.perf_counter()
    sims = [with_simulation(model, e, order=orders.get(e.strategy.placement_order))
            for e in head]
    per_sim = (time.perf_counter() - t0) / max(len(head), 1)
    closed_rank = {e.strategy.label(): i + 1 for i, e in enumerate(head)}
    by_sim = sorted(sims, key=ranking_key)
    out = {"feasible": len(p.strategies), "simulated": len(head),
           "mean_simulation_ms": round(per_sim * 1e3, 2),
           "simulated_best": by_sim[0].strategy.label(),
           "closed_form_best": head[0].strategy.label()}
    for k in (1, 3, 10):
        if len(by_sim) >= k:
            out[f"deepest_closed_rank_of_sim_top{k}"] = max(
                closed_rank[e.strategy.label()] for e in by_sim[:k])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=400,
                    help="simulate at most this many strategies per spec (default 400)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--parts", action="store_true",
                    help="also each part of the mixed clusters that plan --subsets searches")
    args = ap.parse_args(argv)
    specs = [(p.name, load_spec(p)) for p in sorted((ROOT / "configs").glob("*.yaml"))]
    specs += [("gpt2 16x16 (search_time)", parse_spec(gpt2_mixed(16, 16))),
              ("2048 H100+A100 (search_time)", parse_spec(big_mixed()))]
    if args.parts:
        specs += [(f"{name} part {uses}", subset_spec(spec, uses)[0])
                  for name, spec in list(specs) if len(spec.cluster.node_groups) > 1
                  for uses in cluster_subsets(spec.cluster)]
    rows = []
    print(f"{'spec':32} {'feasible':>8} {'simulated':>9} {'ms/sim':>7} {'top1 from':>9} "
          f"{'top3 from':>9} {'top10 from':>10}  best (simulated; closed form)")
    for name, spec in specs:
        try:
            r = dict(depth(spec, args.limit), spec=name)
        except NoFeasibleStrategy:
            print(f"{name:32} no strategy fits", flush=True)
            continue
        rows.append(r)
        print(f"{name:32} {r['feasible']:>8} {r['simulated']:>9} "
              f"{r['mean_simulation_ms']:>7.2f} "
              f"{r.get('deepest_closed_rank_of_sim_top1', '-'):>9} "
              f"{r.get('deepest_closed_rank_of_sim_top3', '-'):>9} "
              f"{r.get('deepest_closed_rank_of_sim_top10', '-'):>10}  "
              f"{r['simulated_best']}; {r['closed_form_best']}", flush=True)
    print(f"'topK from': the deepest closed-form rank among the K best by simulation; the "
          f"default --simulate-top is {DEFAULT_SIMULATE_TOP}, a part's "
          f"{BEST_ONLY_SIMULATE_TOP}.")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
