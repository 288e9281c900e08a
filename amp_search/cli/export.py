"""`amp-search export`: the plan's chosen strategy as the files to run it on a real cluster
(DeepSpeed: trial.json, ds_config.json, partition, hostfile, launch scripts; Megatron-LM:
the pretrain_gpt.py arguments and a torchrun script per node). amp_search.export says where
each file comes from: the functions `amp-search launch` builds its trials with."""
from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..spec import load_spec
from ._args import (STRATEGY_DEGREES, add_profiles_argument, add_strategy_choice,
                    add_strategy_knobs, measurements_for, nonnegative_int, output_file, port,
                    positive_float, positive_int, write_json)


def add_parser(sub) -> None:
    from ..export import DEFAULT_MASTER_PORT, FORMATS

    p = sub.add_parser(
        "export", help="write the config files and launch scripts of a strategy",
        description="Write what runs the plan's N-th strategy (or one given by --pp --dp "
                    "--tmp --mbs) on a real cluster: for DeepSpeed the trial config, "
                    "ds_config.json, the pipeline partition, a hostfile and launch scripts; "
                    "for Megatron-LM the pretrain_gpt.py arguments and a torchrun script per "
                    "node; with a README.md. The files are the ones `amp-search launch` "
                    "runs its trials with. Exits 2 on bad input.")
    p.add_argument("spec", type=Path, help="YAML cluster + model + training spec")
    p.add_argument("--format", required=True, metavar="FORMAT",
                   help=f"{' | '.join(FORMATS)}")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="folder to write (created; must be empty unless --force)")
    p.add_argument("--force", action="store_true",
                   help="write into a non-empty --out (files of the same name are replaced)")
    add_strategy_choice(p, rank_help="export the plan's N-th strategy (default 1: the best)")
    add_strategy_knobs(p, given="with a given strategy: ", sequence_knobs=True)
    p.add_argument("--hostfile", type=Path, metavar="FILE",
                   help="hosts of the spec's nodes, one 'host slots=N' per node in spec order "
                        "(default: cluster.nodes[].hosts, localhost for one node, else "
                        "placeholders node-0, node-1, ...)")
    p.add_argument("--iters", type=positive_int, default=40, metavar="N",
                   help="iterations the exported run trains, warm-up included (default 40)")
    p.add_argument("--warmup", type=nonnegative_int, default=20, metavar="W",
                   help="leading iterations left out of the mean (default 20)")
    p.add_argument("--master-port", type=port, default=DEFAULT_MASTER_PORT, metavar="PORT",
                   help=f"rendezvous port (default {DEFAULT_MASTER_PORT})")
    p.add_argument("--json", type=output_file, metavar="FILE",
                   help="also write a summary as JSON ('-': only the JSON, on stdout)")
    p.add_argument("--max-search-seconds", type=positive_float, default=120.0, metavar="S",
                   help="with --rank: refuse a search estimated to take longer (default 120)")
    add_profiles_argument(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from ..export import FORMATS, export_strategy, write_export
    from ..launch.hostfile import parse_hostfile
    from .plan import chosen_strategy

    if args.format not in FORMATS:   # checked first: one line, before any search
        raise UsageError(f"--format {args.format!r}; accepted: {', '.join(FORMATS)}")
    if args.warmup >= args.iters:
        raise UsageError(f"--warmup ({args.warmup}) must be smaller than --iters "
                         f"({args.iters})")
    out = args.out
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not args.force)):
        raise UsageError(f"--out {out} is not an empty folder; give --force to write into it"
                         if out.is_dir() else f"--out {out} exists and is not a folder")
    spec = load_spec(args.spec)
    hostfile = parse_hostfile(args.hostfile) if args.hostfile is not None else None
    if args.rank is None and all(getattr(args, n) is None for n, _ in STRATEGY_DEGREES):
        args.rank = 1
    if args.rank is None and not spec.backend_given and \
            args.format in (s.training.backend for s in spec.backends()):
        spec = spec.for_backend(args.format)    # a given strategy, costed as it will run
    estimate, where = chosen_strategy(spec, args, measurements_for(spec, args))
    spec = spec.for_backend(estimate.backend)      # a plan of several backends: the row's
    export = export_strategy(spec, estimate.strategy, fmt=args.format, hostfile=hostfile,
                             estimate=estimate, iters=args.iters, warmup=args.warmup,
                             master_port=args.master_port)
    written = write_export(export, out, force=args.force)
    quiet = args.json is not None and str(args.json) == "-"
    if not quiet:
        s = estimate.strategy
        print(f"{s.label()} ({where}), partition {list(s.partition)}, "
              f"predicted {estimate.iteration_time_s:.4g} s/iteration: {args.format} files")
        for path, f in zip(written, export.files):
            print(f"wrote {path}: {f.what}")
        for note in export.notes:
            print(f"note: {note}")
    if args.json is not None:
        write_json(args.json, {"spec": str(args.spec), "spec_sha256": spec.sha256,
                               "chosen": where, "out": str(out),
                               "written": [str(p) for p in written], **export.to_dict()})
    return 0
