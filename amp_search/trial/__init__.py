"""Real trials: the training program one strategy runs (AMP Algorithm 1, last step).

- `model`   the layers of `cost_models.layers`, built with megatron-core tensor parallelism;
- `config`  the trial config JSON (TrialConfig) the launcher writes and `run` reads;
- `ranks`   global rank <-> (stage, replica, tensor rank) <-> device, after DeepSpeed's grid;
- `run`     the per-process entry point: `python -m amp_search.trial.run --config trial.json`.

Importing the package imports nothing heavy; `model` and `run` import torch.
"""
