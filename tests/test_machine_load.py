"""The other programs' load recorded with a measurement, and how a launch shows it."""
from __future__ import annotations

from amp_search.cli.launch import format_trials
from amp_search.launch.orchestrator import TrialRecord
from amp_search.machine_load import BUSY_CORES, OtherLoad, busy_note
from amp_search.records import Strategy
from conftest import time_module_with


def _record(others):
    s = Strategy(pp=1, dp=2, tmp=1, mbs=4, global_batch_size=16, partition=(0, 6),
                 placement=(((0,), (1,)),))
    return TrialRecord(index=1, label=s.label(), strategy=s, predicted_s=0.4, status="ok",
                       measured_mean_s=0.5, measured_std_s=0.01,
                       other_processes_cores=others)


def test_busy_note_only_above_the_threshold():
    assert busy_note(None) == "" and busy_note(0.0) == "" and busy_note(BUSY_CORES) == ""
    assert busy_note(1.24) == "machine busy: other processes used 1.2 cores"


def test_other_load_needs_half_a_second(monkeypatch):
    import io
    import types

    from amp_search import machine_load

    # the machine as OtherLoad reads it, moved by hand: its clock (through a stand-in for the
    # module's `time`, so the global time module is untouched), /proc/stat's busy ticks and
    # this process's own CPU time
    m = {"now": 100.0, "busy_ticks": 1000, "own_s": 2.0}

    def proc_stat(path, *args, **kwargs):
        assert path == "/proc/stat"
        # user nice system idle iowait irq softirq steal guest guest_nice, in ticks
        return io.StringIO(f"cpu  {m['busy_ticks']} 0 0 5000 7 0 0 0 0 0\n")

    def times():
        return types.SimpleNamespace(user=m["own_s"], system=0.0, children_user=0.0,
                                     children_system=0.0)

    fake_os = types.SimpleNamespace(sysconf=lambda name: 100, times=times)
    monkeypatch.setattr(machine_load, "time", time_module_with(monotonic=lambda: m["now"]))
    monkeypatch.setattr(machine_load, "os", fake_os)
    monkeypatch.setattr(machine_load, "open", proc_stat, raising=False)

    load = OtherLoad()
    m.update(now=100.49, busy_ticks=1150, own_s=2.5)
    assert load.others_cores() is None  # 0.49 s: too short a span to tell
    m["now"] = 100.5
    # 1.5 CPU seconds busy, 0.5 of them this process's: 1.0 CPU seconds in 0.5 s
    assert load.others_cores() == 2.0
    m["now"] = 101.0
    assert load.others_cores() == 1.0


def test_launch_table_flags_a_trial_measured_on_a_busy_machine():
    quiet, busy = format_trials([_record(0.1)]), format_trials([_record(1.3)])
    assert "machine busy" not in quiet
    assert "machine busy: other processes used 1.3 cores" in busy
    assert _record(1.3).to_dict()["other_processes_cores"] == 1.3
