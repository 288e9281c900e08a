"""`amp-search profile` (layers) and `amp-search profile-comm` (links)."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import UsageError
from ._args import (add_profiles_argument, nonnegative_int, port, positive_int,
                    profiles_root)


def _int_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def _size_list(text: str) -> tuple[int, ...]:
    from ..spec import SpecError
    from ..units import parse_size

    try:
        return tuple(int(parse_size(x.strip(), "--sizes")) for x in text.split(",") if x.strip())
    except SpecError as exc:
        raise argparse.ArgumentTypeError(str(exc))


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "profile", help="measure each layer's forward/backward time on this device",
        description="Measure forward and backward time of each distinct layer of the spec's "
                    "model (the layer code trials run) for each tensor-parallel degree and "
                    "micro-batch size; writes <profiles>/measured/<device>__<precision>__<hash>"
                    ".json, which plan then uses in place of the analytic estimate. On cpu "
                    "it measures with all of a node's ranks busy at once (--concurrent), as "
                    "the trials run.")
    p.add_argument("spec", help="spec YAML")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="what to run on (default: cuda if available, else cpu)")
    p.add_argument("--name", default=None,
                   help="catalog name of this device (default: the spec's only device type "
                        "of that kind)")
    p.add_argument("--tmp", type=_int_list, default=None, metavar="1,2,4",
                   help="tensor-parallel degrees (default: those the model divides by, up to "
                        "the largest node)")
    p.add_argument("--mbs", type=_int_list, default=(1, 2, 4, 8), metavar="1,2,4,8",
                   help="micro-batch sizes (default 1,2,4,8)")
    p.add_argument("--warmup", type=nonnegative_int, default=3,
                   help="untimed passes per point (3)")
    p.add_argument("--repeats", type=positive_int, default=10,
                   help="timed passes per point and process (10), split over the rounds")
    p.add_argument("--rounds", type=positive_int, default=3,
                   help="times the sweep runs, with fresh modules and inputs, each point's "
                        "median pooling them all, so that a few slow seconds on a shared "
                        "machine do not set a point's figure (3)")
    p.add_argument("--concurrent", type=positive_int, default=None, metavar="N",
                   help="processes that measure the same points at once, in lock-step, as "
                        "the N ranks of a node run a trial (each figure is the median over "
                        "processes and repeats). Default: on cpu the spec's devices per node "
                        "of this type (each process one thread, as the trials); on cuda 1 "
                        "(worker k uses GPU k mod the visible count). 1: this process alone")
    p.add_argument("--out", type=Path, default=None,
                   help="profile file to write (default: one in --profiles DIR/measured)")
    p.add_argument("--no-framework", action="store_true",
                   help="skip the last step: two short real DeepSpeed trials of the model on "
                        "this node (1 and 8 micro-batches) that measure the framework's own "
                        "fixed costs per micro-batch and per iteration, and two more at each "
                        "ZeRO stage 1-3 the spec searches for that stage's own bookkeeping; "
                        "plan adds them when there is no calibration (about 20 s a trial on "
                        "CPU)")
    p.add_argument("--no-speed-probe", action="store_true",
                   help="on cpu, skip timing one block layer in all of the node's processes at "
                        "once right after the sweep (a few seconds): the machine's speed now, "
                        "which launch measures again before each trial to carry the machine's "
                        "drift into its prediction")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_profiles_argument(p, writes=True)
    p.set_defaults(func=run)

    c = subparsers.add_parser(
        "profile-comm", help="measure collectives and point-to-point per link; fit a model",
        description="Measure all-reduce, all-gather, reduce-scatter and point-to-point over "
                    "torch.distributed for a sweep of message and group sizes, inside and "
                    "across nodes, fit alpha-beta and sigmoid models per link, and write "
                    "<profiles>/comm/<device>__<backend>.json, which plan uses instead of the "
                    "spec's bandwidths.")
    c.add_argument("spec", nargs="?", default=None,
                   help="spec YAML (names the device type); or give --name")
    c.add_argument("--name", default=None, help="device type name the profile is for")
    c.add_argument("--launcher", choices=("local", "torchrun"), default="local",
                   help="local: this node only (default); torchrun: one node of a multi-node "
                        "run (run the same command on every node)")
    c.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="gloo on cpu, NCCL on cuda (default: cuda if available)")
    c.add_argument("--nproc", type=positive_int, default=2, help="processes per node (2)")
    c.add_argument("--nnodes", type=positive_int, default=1,
                   help="nodes taking part (1; more with --launcher torchrun)")
    c.add_argument("--node-rank", type=nonnegative_int, default=0,
                   help="this node's index, 0 to nnodes-1 (0)")
    c.add_argument("--master-addr", default="127.0.0.1",
                   help="address of node 0 for the rendezvous (127.0.0.1)")
    c.add_argument("--master-port", type=port, default=None,
                   help="rendezvous port, 1 to 65535 (29511)")
    c.add_argument("--sizes", type=_size_list, default=None, metavar="1KiB,1MiB",
                   help="message sizes (default: 1 KiB to 64 MiB in half-octave steps)")
    c.add_argument("--repeats", type=positive_int, default=30,
                   help="timed operations per point (30)")
    c.add_argument("--out", type=Path, default=None,
                   help="profile file to write (default: one in --profiles DIR/comm)")
    c.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_profiles_argument(c, writes=True)
    c.set_defaults(func=run_comm)


def _device(choice: str | None) -> str:
    if choice is not None:
        return choice
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _default_tmps(spec) -> tuple[int, ...]:
    sizes = spec.model.tp_divisors
    top = max(len(n.devices) for n in spec.cluster.nodes)
    return tuple(t for t in (1, 2, 4, 8, 16) if t <= top and all(s % t == 0 for s in sizes))


def run(args) -> int:
    from ..measurements import layer_profile_dir
    from ..profiling.layers import machine_busy, profile_layers
    from ..spec import load_spec

    spec = load_spec(args.spec)
    device = _device(args.device)
    try:
        profile = profile_layers(spec, device=device, tmps=args.tmp or _default_tmps(spec),
                                 mbss=args.mbs, warmup=args.warmup, repeats=args.repeats,
                                 progress=not args.no_progress, device_name=args.name,
                                 out=args.out, concurrent=args.concurrent,
                                 rounds=args.rounds,
                                 directory=layer_profile_dir(profiles_root(args)))
    except KeyboardInterrupt:
        print("amp-search: interrupted; the points measured so far were written")
        raise
    n = profile.settings.get("concurrent", 1)
    timer = profile.settings.get("timer")
    how = (f"{n} processes at once, median over processes and repeats, {timer}" if n > 1
           else f"one process, {timer}")
    print(f"profile of {profile.device} ({profile.precision}, {device}; {how}) -> "
          f"{profile.path}")
    busy = machine_busy(profile)
    if busy:
        print(f"warning: {busy}")
    print(f"{'layer':40s} {'tmp':>3s} {'mbs':>3s} {'fwd ms':>9s} {'bwd ms':>9s} {'std %':>6s}")
    for e in profile.entries:
        std = 100 * (e.forward_std_s + e.backward_std_s) / max(e.forward_s + e.backward_s, 1e-12)
        print(f"{e.signature:40s} {e.tmp:3d} {e.mbs:3d} {e.forward_s * 1e3:9.3f} "
              f"{e.backward_s * 1e3:9.3f} {std:6.1f}")
    if device == "cpu" and not args.no_speed_probe:
        _speed(spec, profile)
    if not args.no_framework:
        _framework(spec, profile, args)
    return 0


def _speed(spec, profile) -> None:
    """The machine-speed reference (amp_search.profiling.speed), stored in `profile`."""
    import sys

    from ..profiling.speed import measure_speed

    workers = int(profile.settings.get("concurrent", 1))    # as many as the sweep ran
    try:
        probe = measure_speed(spec, workers=workers)
    except KeyboardInterrupt:
        print("amp-search: speed probe not taken (interrupted); the layer profile stands "
              "without it")
        return
    except UsageError as exc:
        print(f"warning: {exc}; launch will not correct for the machine's speed",
              file=sys.stderr)
        return
    profile.speed_probe = probe
    profile.save(profile.path)
    print(f"speed probe: {probe.layer} at micro-batch {probe.mbs}, {probe.workers} processes "
          f"at once: {probe.ms:.2f} ms (launch compares the machine's speed with this)")


def _framework(spec, profile, args) -> None:
    """The framework-overhead probe (amp_search.profiling.framework), stored in `profile`."""
    import os
    import sys

    from ..profiling.framework import (PIPELINE_KIND, PROBE_GAS, measure_framework_overheads,
                                       pipeline_probe_strategies, probe_node,
                                       probe_zero_stages)
    from ._args import measurements_for

    why = probe_node(spec, profile.device)
    if why:
        print(f"framework overheads not measured: {why}")
        return
    stages = probe_zero_stages(spec)
    piped = len(pipeline_probe_strategies(spec))
    devices = len(spec.cluster.nodes[0].devices)
    n = len(PROBE_GAS) * (1 + len(stages)) + piped
    what = ([f"at ZeRO {', '.join(map(str, stages))}"] if stages else []) + \
        ([f"as a pipeline of its {devices} devices"] if piped else [])
    print(f"framework overheads: {n} short DeepSpeed trials of the model on this node"
          f"{', also ' + ' and '.join(what) if what else ''} (Ctrl-C skips them; the layer "
          f"profile is already written)", flush=True)

    def show(p) -> None:
        print(f"  {p.label:24s} gas {p.gas:2d}: measured {p.measured_s * 1e3:8.1f} ms, layers "
              f"predict {p.predicted_s * 1e3:8.1f} ms, residual {p.residual_s * 1e3:+8.1f} ms",
              flush=True)

    def skip(what: str, why: str) -> None:
        instead = "pp 1's costs" if what == PIPELINE_KIND else "its collectives alone"
        print(f"warning: {what}'s own cost not measured ({why}); it is priced with {instead}",
              file=sys.stderr, flush=True)

    try:
        fw = measure_framework_overheads(
            spec, profile, measurements=measurements_for(spec, args),
            progress=not args.no_progress and sys.stderr.isatty(),
            base_env=dict(os.environ), on_probe=show, on_skip=skip)
    except KeyboardInterrupt:
        print("amp-search: framework overheads not measured (interrupted); the layer profile "
              "stands without them")
        return
    except UsageError as exc:
        print(f"warning: framework overheads not measured: {exc}", file=sys.stderr)
        return
    profile.framework_overheads = fw
    profile.save(profile.path)
    print(f"framework overheads: {fw.microbatch_overhead_s * 1e3:.1f} ms per micro-batch of "
          f"the {fw.layers} layers ({fw.layer_overhead_s * 1e3:.2f} ms per layer), "
          f"{fw.step_overhead_s * 1e3:.1f} ms per iteration -> {profile.path}")
    if fw.pipeline_microbatch_overhead_s is not None:
        print(f"  pipeline engine (pp {devices}, dp 1): "
              f"{fw.pipeline_microbatch_overhead_s * 1e3:.1f} ms per micro-batch of the "
              f"{fw.layers} layers, {fw.pipeline_step_overhead_s * 1e3:.1f} ms per iteration")
    for z in fw.zero:
        n = z.params_per_device
        print(f"  ZeRO {z.zero_stage} beyond ZeRO 0: {z.microbatch_s_per_param * n * 1e3:.1f} ms "
              f"per micro-batch, {z.step_s_per_param * n * 1e3:.1f} ms per iteration for "
              f"{n:,} parameters per device ({z.microbatch_s_per_param * 1e9:.2f} and "
              f"{z.step_s_per_param * 1e9:.2f} ns per parameter)")
    missing = sorted(set(stages) - {z.zero_stage for z in fw.zero})
    if missing:
        print(f"  ZeRO {', '.join(map(str, missing))} not measured: priced by their "
              f"collectives alone")
    if piped and fw.pipeline_microbatch_overhead_s is None:
        print("  pipeline engine not measured: pp > 1 priced with pp 1's costs")


def run_comm(args) -> int:
    from ..measurements import link_profile_dir
    from ..profiling.comm import DEFAULT_SIZES, profile_comm

    device = _device(args.device)
    name = args.name
    if name is None and args.spec is not None:
        from ..profiling.layers import profile_device_name
        from ..spec import load_spec

        name = profile_device_name(load_spec(args.spec), device)
    if name is None:
        if device != "cpu":
            raise UsageError("profile-comm: say which device type this is: give the spec or "
                             "--name (a catalog name, e.g. A100-80GB)")
        name = "CPU-local"
    profile = profile_comm(device_name=name, launcher=args.launcher, nproc=args.nproc,
                           nnodes=args.nnodes, node_rank=args.node_rank,
                           master_addr=args.master_addr, master_port=args.master_port,
                           device=device, sizes=args.sizes or DEFAULT_SIZES,
                           repeats=args.repeats, out=args.out,
                           directory=link_profile_dir(profiles_root(args)),
                           progress=not args.no_progress)
    if profile is None:
        print("this node took part in the sweep; node 0 wrote the profile")
        return 0
    print(f"link profile {profile.describe()} -> {profile.path}")
    print(f"{'collective':15s} {'link':6s} {'model':10s} {'alpha us':>9s} {'GB/s':>7s} "
          f"{'err a-b':>8s} {'err sig':>8s}")
    for (coll, link), f in sorted(profile.fits.items()):
        sig = f"{100 * f.mape_sigmoid:7.1f}%" if f.sigmoid else "       -"
        print(f"{coll:15s} {link:6s} {f.model:10s} {f.alpha_s * 1e6:9.1f} "
              f"{f.bandwidth_bytes_per_s / 1e9:7.2f} {100 * f.mape_alpha_beta:7.1f}% {sig}")
    missing = [lk for lk in ("intra", "inter") if lk not in profile.links_measured]
    if missing:
        print(f"not measured: {', '.join(missing)} (one node); plan keeps the spec's "
              f"bandwidth there")
    return 0
