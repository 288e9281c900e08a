"""The cost model's free coefficients: what `amp-search calibrate` fits to measured trials.

The defaults are the uncalibrated model. Every coefficient enters the prediction in one place:
- compute_scale[device]       multiplies each layer's forward/backward time on that device type;
- bandwidth_scale[link]       multiplies the nominal bandwidth of a link kind ('intra' | 'inter');
- latency_s[link]             is added per message (alpha of the alpha-beta model) on that link;
- dp_overlap                  fraction of the data-parallel gradient sync hidden behind backward;
- microbatch_overhead_s       fixed cost per micro-batch per stage (kernel launch, Python,
                              schedule bookkeeping; Lin et al. 2024 show it dominates small mbs);
- step_overhead_s             fixed cost per iteration (optimizer step, framework);
- layer_overhead_s            the training framework's fixed cost per layer per micro-batch
                              (engine hooks and bookkeeping per module and parameter), half in
                              the forward and half in the backward pass; measured by
                              `amp-search profile`'s probe trials (not fitted by calibrate);
- pipeline_layer_overhead_delta_s, pipeline_step_overhead_delta_s
                              what DeepSpeed's pipeline engine (pp > 1) costs beyond
                              layer_overhead_s and step_overhead_s (negative where it costs
                              less; the sums are taken as 0 at least; the per-iteration one
                              only at dp 1); measured by `amp-search profile`'s probe trials
                              (not fitted by calibrate, which fits step_overhead_s under both);
- zero_microbatch_s_per_param[stage], zero_step_s_per_param[stage]
                              ZeRO stage 1-3's own bookkeeping beyond stage 0's (gradient
                              buckets, partition copies, per-partition reductions), per
                              parameter a device holds: in every micro-batch's backward, and
                              once per iteration beside the optimizer step; measured by
                              `amp-search profile`'s probe trials (not fitted by calibrate);
- host_block_pass_s[device], host_tp_allreduce_per_rank_s[device], kernel_floor_s[device]
                              replace the catalog's fixed costs of the analytic layer time
                              (cost_models.compute.HostCosts / DeviceSpeed) for that device type.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

LINK_KINDS = ("intra", "inter")


@dataclass(frozen=True, kw_only=True)
class CostParams:
    compute_scale: dict = field(default_factory=dict)
    """device type name -> multiplier on layer compute time (missing: 1.0)."""
    bandwidth_scale: dict = field(default_factory=dict)
    """'intra' | 'inter' -> multiplier on nominal bandwidth (missing: 1.0)."""
    latency_s: dict = field(default_factory=dict)
    """'intra' | 'inter' -> seconds per message (missing: 0)."""
    dp_overlap: float = 0.0
    microbatch_overhead_s: float = 0.0
    step_overhead_s: float = 0.0
    layer_overhead_s: float = 0.0
    host_block_pass_s: dict = field(default_factory=dict)
    """device type name -> host seconds per block pass (missing: the catalog's)."""
    host_tp_allreduce_per_rank_s: dict = field(default_factory=dict)
    """device type name -> host seconds per TP all-reduce per extra rank (missing: catalog)."""
    kernel_floor_s: dict = field(default_factory=dict)
    """device type name -> device seconds per block pass at least (missing: the catalog's)."""
    pipeline_layer_overhead_delta_s: float = 0.0
    pipeline_step_overhead_delta_s: float = 0.0
    zero_microbatch_s_per_param: dict = field(default_factory=dict)
    """ZeRO stage (int) -> seconds per parameter a device holds, per micro-batch (missing: 0)."""
    zero_step_s_per_param: dict = field(default_factory=dict)
    """ZeRO stage (int) -> seconds per parameter a device holds, per iteration (missing: 0)."""

    def compute(self, device: str) -> float:
        return float(self.compute_scale.get(device, 1.0))

    def bandwidth(self, link: str) -> float:
        return float(self.bandwidth_scale.get(link, 1.0))

    def latency(self, link: str) -> float:
        return float(self.latency_s.get(link, 0.0))

    def fixed_cost(self, name: str, device: str, default: float) -> float:
        """A per-device fixed cost (host_block_pass_s, host_tp_allreduce_per_rank_s,
        kernel_floor_s): the fitted value if there is one, else `default` (the catalog's)."""
        return float(getattr(self, name).get(device, default))

    def to_dict(self) -> dict:
        return asdict(self)

    def layer_overhead(self, pp: int) -> float:
        """The framework's per-layer, per-micro-batch cost under pp stages."""
        if pp <= 1:
            return self.layer_overhead_s
        return max(0.0, self.layer_overhead_s + self.pipeline_layer_overhead_delta_s)

    def step_overhead(self, pp: int, dp: int) -> float:
        """The per-iteration cost under pp stages and dp replicas: the pipeline engine's delta
        only at dp 1 (it was measured without gradient reduction; with dp > 1 the pp 1
        figure, measured with it, stands)."""
        if pp <= 1 or dp > 1:
            return self.step_overhead_s
        return max(0.0, self.step_overhead_s + self.pipeline_step_overhead_delta_s)

    def zero_cost(self, name: str, zero_stage: int) -> float:
        """zero_microbatch_s_per_param or zero_step_s_per_param of `zero_stage` (0: none)."""
        return float(getattr(self, name).get(int(zero_stage), 0.0))

    @classmethod
    def from_dict(cls, d: dict) -> "CostParams":
        out = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        for k in ("zero_microbatch_s_per_param", "zero_step_s_per_param"):
            if k in out:        # JSON object keys are strings
                out[k] = {int(z): float(v) for z, v in out[k].items()}
        return cls(**out)
