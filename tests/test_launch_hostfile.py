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


@pytest.mark.parametrize("host,local", [
    ("localhost", True), ("LocalHost", True), ("127.0.0.1", True), ("127.0.0.2", True),
    ("127.255.255.254", True), ("::1", True), ("0:0:0:0:0:0:0:1", True), ("::1%lo", True),
    ("::ffff:127.0.0.2", True),
    ("0.0.0.0", False), ("::", False), ("128.0.0.1", False), ("126.255.255.255", False),
    ("10.0.0.1", False), ("fe80::1%lo", False), ("::ffff:10.0.0.1", False),
    ("localhost.example.org", False), ("localhost.", False), ("mylocalhost", False),
    ("127.1", False), ("127.0.0.01", False), ("2130706433", False), (" 127.0.0.1", False),
    ("", False), (None, False), (2130706433, False),
])
def test_loopback_hosts_are_this_machine(host, local):
    """The whole 127.0.0.0/8, ::1 and 'localhost' are this machine (launchers start them
    without ssh); nothing else, and nothing that is not a valid host."""
    from amp_search.hosts import is_loopback_host

    assert is_loopback_host(host) is local
    assert all(is_loopback_host(h) for h in ("localhost", "127.0.0.1", "::1"))


def test_two_loopback_nodes_hostfile():
    """Two "nodes" of one machine: distinct loopback addresses, one line each."""
    hosts = parse_hostfile_text("127.0.0.1 slots=2\n127.0.0.2 slots=2\n")
    assert [h.host for h in hosts] == ["127.0.0.1", "127.0.0.2"]
    with pytest.raises(UsageError, match="listed twice"):
        parse_hostfile_text("127.0.0.1 slots=1\n127.0.0.1 slots=1\n")
