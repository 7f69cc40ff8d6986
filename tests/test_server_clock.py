"""The API server's clock read from the Date of its answers (webhook.cluster.clock): what every ledger age is
measured on, whatever this process's wall clock says."""

from __future__ import annotations

from email.utils import formatdate

from webhook.cluster.clock import ServerClock

SERVER = 1_800_000_000.0  # the API server's time at the first answer (a whole second)


def _answer(clock: ServerClock, local: list[float], server: float, latency: float = 0.02) -> None:
    """A request sent now (local), stamped by the API server at ``server`` midway, read ``latency`` later."""
    sent = local[0]
    local[0] += latency
    clock.sample(sent, local[0], formatdate(int(server), usegmt=True))


def test_the_offset_from_answers_straddling_a_second_is_known_to_well_within_a_second() -> None:
    local = [SERVER - 500.3]  # this wall clock is 500.3 s behind (plus what each answer takes)
    clock = ServerClock(lambda: local[0])
    assert clock.now() == local[0]  # nothing known yet
    for step in range(40):  # answers every 0.13 s: some fall just after the turn of a second
        server = local[0] + 500.3 + 0.01
        _answer(clock, local, server)
        local[0] += 0.11
    assert abs(clock.now() - (local[0] + 500.3)) < 0.1


def test_a_clock_stepped_starts_the_estimate_anew() -> None:
    local = [SERVER]
    clock = ServerClock(lambda: local[0])
    for _ in range(20):
        _answer(clock, local, local[0] + 0.01)
        local[0] += 0.13
    assert abs(clock.offset) < 0.2
    local[0] -= 3600  # NTP stepped this process's clock back an hour
    for _ in range(3):
        _answer(clock, local, local[0] + 3600 + 0.01)
        local[0] += 0.13
    assert abs(clock.offset - 3600) < 1.0


def test_a_date_that_does_not_read_is_skipped() -> None:
    clock = ServerClock(lambda: SERVER)
    clock.sample(SERVER, SERVER, "yesterday")
    assert clock.offset == 0.0
