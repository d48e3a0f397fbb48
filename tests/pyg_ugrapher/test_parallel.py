"""ParallelInfo: partial schedules, knobs per strategy, (de)serialisation and every validation error."""

import pytest

from pyg_ugrapher.parallel import FIXED_KNOBS, STRATEGIES, STRATEGY_KNOBS, ParallelInfo, feature_limit


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategy_alone_is_partial_and_round_trips(strategy):
    info = ParallelInfo(strategy)
    assert not info.is_complete
    assert info.unset_knobs == tuple(k for k in STRATEGY_KNOBS[strategy] if k not in FIXED_KNOBS)
    assert info.knobs == {k: v for k, v in FIXED_KNOBS.items() if k in STRATEGY_KNOBS[strategy]}
    assert ParallelInfo.deserialize(info.serialize()) == info
    assert hash(ParallelInfo.deserialize(info.serialize())) == hash(info)
    assert repr(info).startswith(f"ParallelInfo({strategy}, ") and "block_f=?" in repr(info)


def test_partial_equality_and_hash():
    """Unset knobs stay unset: a partial schedule equals only the same partial schedule."""
    partial = ParallelInfo("vertex", block_f=32)
    complete = ParallelInfo("vertex", block_v=4, block_e=32, block_f=32, num_warps=4)
    assert partial == ParallelInfo("vertex", block_f=32, num_stages=1)
    assert hash(partial) == hash(ParallelInfo("vertex", block_f=32))
    assert partial != complete and len({partial, complete}) == 2
    assert partial.unset_knobs == ("block_v", "block_e", "num_warps") and complete.is_complete
    assert partial.admits(complete) and complete.admits(complete) and not complete.admits(partial)
    assert not partial.admits(complete.with_knobs(block_f=16))
    assert not ParallelInfo("edge").admits(complete)
    assert partial.with_knobs(block_v=4, block_e=32, num_warps=4) == complete
    assert complete.with_knobs(num_warps=None) == ParallelInfo("vertex", block_v=4, block_e=32, block_f=32)
    assert ParallelInfo("edge").block_v is None and ParallelInfo("edge").group_size is None
    assert ParallelInfo("vertex").with_knobs(block_f=8).block_f == 8


@pytest.mark.parametrize(
    "info",
    [
        ParallelInfo("vertex", block_f=32),
        ParallelInfo("edge", block_e=128, num_warps=2),
        ParallelInfo("group", group_size=3, block_v=2, block_e=2, block_f=4, num_warps=1),
        ParallelInfo("vertex", block_v=4, block_e=32, block_f=32, num_warps=4, num_stages=2),
    ],
    ids=str,
)
def test_serialize_round_trip(info):
    text = info.serialize()
    assert ParallelInfo.deserialize(text) == info and ParallelInfo.deserialize(text).serialize() == text
    assert text.startswith(info.strategy + ":") and all(f"{k}={v}" in text for k, v in info.knobs.items())


@pytest.mark.parametrize(
    "kwargs,error,field",
    [
        (dict(strategy="warp"), ValueError, "strategy"),
        (dict(strategy="edge", block_v=4), ValueError, "block_v"),
        (dict(strategy="edge", group_size=4), ValueError, "group_size"),
        (dict(strategy="vertex", group_size=4), ValueError, "group_size"),
        (dict(strategy="edge", num_stages=2), ValueError, "num_stages"),
        (dict(strategy="vertex", block_f=24), ValueError, "block_f"),
        (dict(strategy="vertex", block_e=3), ValueError, "block_e"),
        (dict(strategy="vertex", block_v=6), ValueError, "block_v"),
        (dict(strategy="vertex", num_warps=3), ValueError, "num_warps"),
        (dict(strategy="vertex", block_f=0), ValueError, "block_f"),
        (dict(strategy="vertex", block_f=2048), ValueError, "block_f"),
        (dict(strategy="vertex", num_warps=32), ValueError, "num_warps"),
        (dict(strategy="vertex", num_stages=5), ValueError, "num_stages"),
        (dict(strategy="group", group_size=0), ValueError, "group_size"),
        (dict(strategy="vertex", block_f=8.0), TypeError, "block_f"),
        (dict(strategy="vertex", block_f=True), TypeError, "block_f"),
        (dict(strategy="vertex", block_v=64, block_e=32, block_f=64), ValueError, "block_f"),
        (dict(strategy="vertex", block_v=256, block_e=128), ValueError, "block_e"),  # unset knobs count as 1
        (dict(strategy="group", group_size=8, block_e=16), ValueError, "group_size"),
    ],
)
def test_validation_errors(kwargs, error, field):
    with pytest.raises(error, match=f"^{field}:"):
        ParallelInfo(**kwargs)


def test_validate_for():
    info = ParallelInfo("vertex", block_v=4, block_e=32, block_f=8, num_warps=4)
    assert info.validate_for(5) is info and info.validate_for(8) is info
    with pytest.raises(ValueError, match="^block_f:"):
        info.validate_for(4)
    assert info.with_knobs(block_f=1).validate_for(0)
    with pytest.raises(ValueError, match="^parallel_info: .* leaves block_v, block_e, num_warps unset"):
        ParallelInfo("vertex", block_f=8).validate_for(8)


@pytest.mark.parametrize("width,limit", [(0, 1), (1, 1), (3, 4), (8, 8), (33, 64), (1024, 1024)])
def test_narrowed_for(width, limit):
    """A feature tile wider than the operator narrows to the width's power of two; others stay."""
    assert feature_limit(width) == limit
    wide = ParallelInfo("edge", block_e=8, block_f=1024, num_warps=4)
    narrowed, changed = wide.narrowed_for(width)
    assert narrowed == wide.with_knobs(block_f=limit) and narrowed.validate_for(width) is narrowed
    assert changed == ({} if limit == 1024 else {"block_f": 1024})
    assert ParallelInfo("group").narrowed_for(width) == (ParallelInfo("group"), {})
