"""ParallelInfo: defaults, knobs per strategy, (de)serialisation and every validation error."""
import pytest

from pyg_ugrapher.parallel import STRATEGIES, STRATEGY_KNOBS, ParallelInfo


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_defaults_and_round_trip(strategy):
    info = ParallelInfo(strategy)
    assert info.knobs == STRATEGY_KNOBS[strategy]
    assert ParallelInfo.deserialize(info.serialize()) == info
    assert hash(ParallelInfo.deserialize(info.serialize())) == hash(info)
    assert repr(info).startswith(f"ParallelInfo({strategy}, ")


def test_unset_knobs_equal_defaults():
    assert ParallelInfo("vertex", block_f=32) == ParallelInfo("vertex", block_v=4, block_e=32, block_f=32,
                                                              num_warps=4, num_stages=1)
    assert ParallelInfo("edge").block_v is None and ParallelInfo("edge").group_size is None
    assert ParallelInfo("vertex").with_knobs(block_f=8).block_f == 8
    info = ParallelInfo("group", group_size=3, block_v=2, block_e=2, block_f=4, num_warps=1)
    assert ParallelInfo.deserialize(info.serialize()) == info


@pytest.mark.parametrize("kwargs,error,field", [
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
    (dict(strategy="group", group_size=8, block_e=16), ValueError, "group_size"),
])
def test_validation_errors(kwargs, error, field):
    with pytest.raises(error, match=f"^{field}:"):
        ParallelInfo(**kwargs)


def test_validate_for():
    info = ParallelInfo("vertex", block_f=8)
    assert info.validate_for(5) is info and info.validate_for(8) is info
    with pytest.raises(ValueError, match="^block_f:"):
        info.validate_for(4)
    assert ParallelInfo("vertex", block_f=1).validate_for(0)
    assert ParallelInfo("group", block_f=8).validate_for(8)
