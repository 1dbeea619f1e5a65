"""A pass declares at registration the assumptions it reads; what reads them is derived."""

from __future__ import annotations

import pytest

from infercc.assumptions import NONEMPTY_SEQUENCES
from infercc.config import BuildConfig, assumption_passes
from infercc.errors import InferccError
from infercc.passes.manager import REGISTRY, PassContext, register_pass


def test_the_passes_that_read_an_assumption_are_those_that_declare_it():
    assert assumption_passes(NONEMPTY_SEQUENCES) == tuple(
        sorted(
            ("emit-attention", "remove-nan-guard", "fuse-group-query-attention"),
            key=list(REGISTRY).index,
        )
    )
    assert assumption_passes("no-such-assumption") == ()


def test_assume_with_gqa_still_running_is_not_refused():
    """fuse-group-query-attention reads nonempty-sequences too: disabling the two attention
    passes leaves the assumption an effect (it was refused as having none)."""
    config = BuildConfig(
        assume=(NONEMPTY_SEQUENCES,), disable_passes=("emit-attention", "remove-nan-guard")
    )
    config.check()
    every = BuildConfig(
        assume=(NONEMPTY_SEQUENCES,), disable_passes=assumption_passes(NONEMPTY_SEQUENCES)
    )
    with pytest.raises(InferccError, match="has no effect: the passes that use it are disabled"):
        every.check()


def test_a_pass_reading_an_assumption_it_did_not_declare_is_an_error():
    @register_pass("test-undeclared-assumption-reader")
    def reader(graph, ctx):  # pragma: no cover - never run as a pass here
        return None

    try:
        ctx = PassContext(assumptions=frozenset({NONEMPTY_SEQUENCES}))
        ctx.current_pass = "test-undeclared-assumption-reader"
        with pytest.raises(InferccError, match="reads assumption 'nonempty-sequences', which"):
            ctx.stated(NONEMPTY_SEQUENCES)
        with pytest.raises(InferccError, match="does not declare"):
            ctx.assumes(NONEMPTY_SEQUENCES)
        ctx.current_pass = "emit-attention"  # declares it
        assert ctx.stated(NONEMPTY_SEQUENCES) and ctx.assumes(NONEMPTY_SEQUENCES)
        assert ctx.assumed == {NONEMPTY_SEQUENCES: {"emit-attention": 1}}
    finally:
        del REGISTRY["test-undeclared-assumption-reader"]
