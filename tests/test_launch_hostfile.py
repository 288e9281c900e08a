"""The hostfile parser: `host slots=N`, validated."""
from __future__ import annotations

import pytest

from amp_search.errors import UsageError
from amp_search.launch.hostfile import (HostSlots, format_hostfile, parse_hostfile,
                                        parse_hostfile_text)


def test_slots_are_whole_numbers_not_first_digit():
    # Metis read 'slots=16' as 1
    hosts = parse_hostfile_text("worker-0 slots=16\nworker-1 slots=8\n")
    assert hosts == (HostSlots(host="worker-0", slots=16), HostSlots(host="worker-1", slots=8))


def test_comments_blank_lines_and_spacing():
    text = "# cluster\n\n  10.0.0.1   slots=4   # first\nnode-b.example.com slots = 2\n"
    assert parse_hostfile_text(text) == (HostSlots(host="10.0.0.1", slots=4),
                                         HostSlots(host="node-b.example.com", slots=2))


@pytest.mark.parametrize("text,match", [
    ("bad;rm slots=4\n", "not a valid hostname"),
    ("bad;rm -rf / slots=4\n", "expected .HOST slots=N."),
    ("$(whoami) slots=4\n", "not a valid hostname"),
    ("host slots=0\n", "slots must be a whole number"),
    ("host slots=1.5\n", "slots must be a whole number"),
    ("host slots=-2\n", "slots must be a whole number"),
    ("host\n", "expected 'HOST slots=N'"),
    ("host slots=2\nhost slots=4\n", "listed twice"),
    ("# nothing\n", "no hosts"),
])
def test_bad_hostfiles(text, match):
    with pytest.raises(UsageError, match=match):
        parse_hostfile_text(text, "hf")


def test_error_names_the_line():
    with pytest.raises(UsageError, match=r"hf:2:"):
        parse_hostfile_text("a slots=1\nb slots=x\n", "hf")


def test_missing_file(tmp_path):
    with pytest.raises(UsageError, match="hostfile not found"):
        parse_hostfile(tmp_path / "nope")


def test_round_trip(tmp_path):
    hosts = (HostSlots(host="a", slots=16), HostSlots(host="b", slots=2))
    p = tmp_path / "hf"
    p.write_text(format_hostfile(hosts))
    assert parse_hostfile(p) == hosts
