"""The other programs' load recorded with a measurement, and how a launch shows it."""
from __future__ import annotations

from amp_search.cli.launch import format_trials
from amp_search.launch.orchestrator import TrialRecord
from amp_search.machine_load import BUSY_CORES, OtherLoad, busy_note
from amp_search.records import Strategy


def _record(others):
    s = Strategy(pp=1, dp=2, tmp=1, mbs=4, global_batch_size=16, partition=(0, 6),
                 placement=(((0,), (1,)),))
    return TrialRecord(index=1, label=s.label(), strategy=s, predicted_s=0.4, status="ok",
                       measured_mean_s=0.5, measured_std_s=0.01,
                       other_processes_cores=others)


def test_busy_note_only_above_the_threshold():
    assert busy_note(None) == "" and busy_note(0.0) == "" and busy_note(BUSY_CORES) == ""
    assert busy_note(1.24) == "machine busy: other processes used 1.2 cores"


def test_other_load_needs_half_a_second():
    assert OtherLoad().others_cores() is None  # too short a span to tell


def test_launch_table_flags_a_trial_measured_on_a_busy_machine():
    quiet, busy = format_trials([_record(0.1)]), format_trials([_record(1.3)])
    assert "machine busy" not in quiet
    assert "machine busy: other processes used 1.3 cores" in busy
    assert _record(1.3).to_dict()["other_processes_cores"] == 1.3
