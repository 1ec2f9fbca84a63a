"""The plugin's own contract test: copy this file into your plugin and name your class.

Each of essa's conformance checks (strategies/testing.py) builds the strategy on a small problem
and fails with one line naming the check and what it saw: ask's shape, dtype and fresh copy;
seeding; one-line ValueErrors for wrong shapes; no mutated inputs; NaN ranked last; exact resume
from a pickled state_dict; a fully tied generation moving nothing and a partly tied one moving
only by the ranks; and the state size and peak memory at D 8192 (printed; run pytest -s).
Run it with the plugin importable (installed, or this directory on sys.path as pytest does here).
"""
import pytest

from essa_plugin_example import RandomSearch
from strategies.testing import CHECKS, check_memory, format_memory

SETUP = {"population_size": RandomSearch.config["population_size"], "sigma0": RandomSearch.config["sigma0"]}


@pytest.mark.parametrize("check", CHECKS[:-1], ids=lambda check: check.__name__)
def test_contract(check):
    check(RandomSearch, **SETUP)


def test_memory_at_d_8192():
    report = check_memory(RandomSearch, sigma0=SETUP["sigma0"], max_state_mb=16, max_peak_mb=64)  # your limits
    print(f"RandomSearch: {format_memory(report)}")
