"""The decoder memory budget of `inspect --target`."""

from __future__ import annotations

import onnx

from infercc.analysis.decoder import decoder_memory, decoder_signature, weight_bytes
from infercc.analysis.model_info import inspect_model
from infercc.analysis.targets import get_target
from infercc.ir import import_model
from tests.decoders import tiny_decoder


def test_budget_per_context():
    proto = tiny_decoder(layers=2, hidden=64, heads=4)
    model = import_model(proto)
    target = get_target("t4")
    d = decoder_memory(model, proto, target)
    sig = decoder_signature(proto)
    # 2 layers x (key, value) x 4 heads x 16 x 4 bytes per token and batch row
    assert d["kv_bytes_per_token"] == sig.kv_bytes_per_token == 2 * 2 * 4 * 16 * 4
    assert d["max_positions"] == 256  # the position table
    assert [r["context"] for r in d["contexts"]] == [256]
    row = d["contexts"][0]
    assert row["kv_cache_bytes"] == 256 * d["kv_bytes_per_token"]
    assert d["weights_bytes"] == weight_bytes(model)
    assert row["total_bytes"] > d["weights_bytes"] + row["kv_cache_bytes"] + row["activation_bytes"]
    batch = row["largest_batch"]
    per_row = row["kv_cache_bytes"] + row["activation_bytes"]
    assert batch is not None
    assert abs(batch * per_row - target.memory_bytes) < 0.2 * target.memory_bytes


def test_largest_batch_shrinks_as_the_context_grows():
    proto = tiny_decoder(layers=1, hidden=64, heads=4, positions=2048)
    d = decoder_memory(import_model(proto), proto, get_target("t4"))
    assert [r["context"] for r in d["contexts"]] == [256, 512, 1024, 2048]
    batches = [r["largest_batch"] for r in d["contexts"]]
    assert batches == sorted(batches, reverse=True) and batches[0] > 3 * batches[-1]
    assert d["largest_context_at_batch_1"] == 2048


def test_inspect_reports_it_only_for_decoders(tmp_path):
    path = tmp_path / "dec.onnx"
    onnx.save(tiny_decoder(layers=1), path)
    report = inspect_model(path, target="a100")
    assert report.memory["decoder"]["kv_bytes_per_token"] == 2 * 4 * 16 * 4
    assert inspect_model(path).memory is None
