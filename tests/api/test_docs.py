"""The documentation of kvtool.api cannot drift: docstring examples run, docs/api.md's reference is generated from
the docstrings, and every snippet of the worked example (docs/diagnoses.md) runs and prints what the page shows."""

from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

import kvtool.api
from tests.api import doc_snippets, reference
from tests.support import REPO_ROOT

MODULES = ["kvtool.api._estimate", "kvtool.api._events", "kvtool.api._simulate", "kvtool.api._repro"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0
    assert result.attempted > 0


def test_every_public_function_has_an_example():
    for name in kvtool.api.__all__:
        obj = getattr(kvtool.api, name)
        if inspect.isfunction(obj):
            assert ">>> " in (obj.__doc__ or ""), f"{name} has no runnable example"


def test_api_reference_is_generated_from_the_docstrings():
    text = reference.API_DOC.read_text()
    assert reference.current_section(text) == reference.reference(), (
        "docs/api.md is stale: run `python -m tests.api.reference --write`"
    )


def test_diagnoses_page_runs_and_prints_what_it_shows():
    page = REPO_ROOT / "docs" / "diagnoses.md"
    namespace: dict = {}
    results = doc_snippets.run(page, namespace)
    assert len(results) >= 10
    for number, (snippet, got) in enumerate(results, 1):
        if snippet.expected is not None:
            assert got == snippet.expected, (
                f"snippet {number} of docs/diagnoses.md printed something else: run "
                "`python -m tests.api.doc_snippets docs/diagnoses.md --write` and review the diff"
            )
    # The figures against closed forms of the generated scenarios (not against the page):
    # 1. frees delayed by N(800 ms, 50 ms): the median latency is 800 ms within a few ms
    assert namespace["late"].summary["free_latency_ms_p50"] == pytest.approx(800, abs=10)
    # Little's law: blocks in use scale with the time they are held; holding + 0.8 s over holding + ~3.5 ms
    ratio = namespace["ratio"]
    fixed = namespace["fixed"].requests
    expected = ((fixed.holding_time_s + 0.8 - 0.0035) * fixed.block_seconds / fixed.holding_time_s).sum() / (
        fixed.block_seconds.sum()
    )
    assert ratio == pytest.approx(expected, rel=0.05)
    # 2. only the 30 partner requests share the cached prompt before: the first stores it, 29 hit; after
    #    normalising, every chat request but the first hits: 870 - 1 of 1,000
    assert namespace["before"].prefix_reuse["requests_with_hit"] == 29
    assert namespace["after"].prefix_reuse["requests_with_hit"] == 869
    assert namespace["after"].prefix_reuse["most_common_hit_tokens"] == 496  # 31 full blocks of the 500 tokens
    # 3. the alert fires in the single pool
    assert namespace["shared"].long_requests["alert"] is True
