"""Running the top strategies for real (AMP Algorithm 1, last step) and keeping the results.

    orchestrator  run_trials(spec, estimates, LaunchOptions) -> [TrialRecord]; best_trial
    launchers     argv lists for local torchrun, the deepspeed launcher, torchrun per node, srun
    megatron      Megatron-LM pretrain_gpt.py arguments for a strategy (--backend megatron)
    hostfile      DeepSpeed's `host slots=N` hostfile, validated
    results_db    the SQLite database of every trial (ResultsDB)
    process       process-group start / timeout / kill, OOM detection, log tails
"""
from .hostfile import HostSlots, parse_hostfile, parse_hostfile_text
from .launchers import LAUNCHERS, Command, TrialLaunch
from .orchestrator import (BACKENDS, LaunchOptions, TrialRecord, TrialRequest, best_trial,
                           default_results_path, run_trials, trial_key)
from .results_db import FINISHED, ResultRow, ResultsDB

__all__ = [
    "BACKENDS", "Command", "FINISHED", "HostSlots", "LAUNCHERS", "LaunchOptions", "ResultRow",
    "ResultsDB", "TrialLaunch", "TrialRecord", "TrialRequest", "best_trial",
    "default_results_path", "parse_hostfile", "parse_hostfile_text", "run_trials", "trial_key",
]
