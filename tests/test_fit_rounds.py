"""benchmarks.fit_rounds: every program once per round, the order rotated by one each round, each call timed."""

from __future__ import annotations

from benchmarks.fit_rounds import FIT_MODES, fit_rounds


def test_each_round_runs_every_program_once_in_a_rotated_order():
    calls = []
    rates = fit_rounds(lambda program, steps: calls.append((program, steps)), ("a", "b", "c"), steps=5, repeats=4)
    assert [p for p, _ in calls] == ["a", "b", "c", "b", "c", "a", "c", "a", "b", "a", "b", "c"]
    assert {s for _, s in calls} == {5}
    assert {p: len(r) for p, r in rates.items()} == {"a": 4, "b": 4, "c": 4}
    assert all(r > 0 for values in rates.values() for r in values)


def test_the_modes_check_fewer_steps_than_they_time():
    assert all(0 < m.check and 0 < m.steps and m.repeats >= 2 for m in FIT_MODES.values())
    assert FIT_MODES["full"].repeats >= 5


def test_the_command_line_names_the_mode_the_extra_arguments_and_the_repeats():
    import argparse

    from benchmarks.fit_rounds import add_mode_arguments, chosen_mode, command_line

    parser = argparse.ArgumentParser()
    add_mode_arguments(parser, "tf2-routes")
    args = parser.parse_args(["--smoke", "--repeats", "3"])
    assert chosen_mode(args) == ("smoke", FIT_MODES["smoke"].__class__(**{**vars(FIT_MODES["smoke"]), "repeats": 3}))
    assert command_line("tf2_routes", args, "--kinds", "k") == \
        "python -m benchmarks.tf2_routes --smoke --kinds k --repeats 3"
    assert command_line("tf2_strategy", parser.parse_args([])) == "python -m benchmarks.tf2_strategy"
