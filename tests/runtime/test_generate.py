"""`bench --generate`: the greedy loop, its figures, the decoder signature, and bad input."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from onnx import helper as oh

from infercc.analysis.decoder import decoder_signature, prefill_feeds
from infercc.errors import InferccError
from infercc.runtime.generate import compare_generation, generate, read_prompt
from tests.decoders import greedy_reference, tiny_decoder
from tests.helpers import make_model, run_cli

# bench --generate at its cheapest: 3 tokens after a 4-token prompt, one timed run
QUICK = ("--generate", "3", "--prompt-len", "4", "--iters", "1", "--warmup", "0", "--no-memory")


@pytest.fixture(scope="module")
def decoder_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("dec") / "decoder.onnx"
    onnx.save(tiny_decoder(), path)
    return path


@pytest.mark.parametrize("shape", [(1, 7), (2, 3)])
def test_tokens_equal_a_plain_onnxruntime_loop(decoder_path, shape):
    prompt = np.random.default_rng(1).integers(0, 50, shape)
    report = generate(decoder_path, 9, prompt=prompt, warmup=0, runs=2, memory=False)
    assert report.stats.tokens == greedy_reference(decoder_path, prompt, 9).tolist()
    s = report.stats
    assert report.batch == shape[0] and report.prompt_len == shape[1]
    assert s.steps == 8 and s.runs == 2
    assert 0 < s.tpot_p50_ms <= s.tpot_p90_ms <= s.tpot_p99_ms
    assert s.decode_tokens_per_s > 0 and s.ttft_ms > 0
    # 2 layers x (key, value) x batch x 4 heads x (prompt + 8 cached tokens) x 16 x 4 bytes
    assert s.kv_cache_bytes == 4 * shape[0] * 4 * (shape[1] + 8) * 16 * 4


def test_random_prompt_is_seeded_and_in_vocabulary(decoder_path):
    a = generate(decoder_path, 3, prompt_len=5, warmup=0, runs=1, memory=False, seed=3)
    b = generate(decoder_path, 3, prompt_len=5, warmup=0, runs=1, memory=False, seed=3)
    assert a.stats.tokens == b.stats.tokens
    assert all(0 <= t < 50 for row in a.stats.tokens for t in row)


def test_peak_memory_in_a_fresh_process(decoder_path):
    report = generate(decoder_path, 4, prompt_len=8, warmup=0, runs=1, memory=True)
    m = report.stats.memory
    assert m.peak_rss_bytes > m.baseline_rss_bytes > 0
    assert m.kv_cache_bytes == report.stats.kv_cache_bytes
    assert m.model_bytes == decoder_path.stat().st_size


def test_compare_interleaves_and_agrees_with_itself(decoder_path):
    report = compare_generation(
        decoder_path, decoder_path, 6, prompt_len=4, warmup=0, runs=2, memory=False
    )
    assert report.token_agreement == 1.0
    assert report.a.tokens == report.b.tokens
    assert report.a.steps == report.b.steps == 5
    assert report.tpot_ratio.p10 <= report.tpot_ratio.median <= report.tpot_ratio.p90
    assert set(report.to_dict()) >= {"a", "b", "ttft_ratio", "tpot_ratio", "tokens_per_s_ratio"}


def test_signature_pairs_past_and_present():
    sig = decoder_signature(tiny_decoder(layers=2))
    assert sig.input_ids == "input_ids" and sig.logits == "logits" and sig.vocab == 50
    assert [(c.past, c.present) for c in sig.caches][:2] == [
        ("past_key_values.0.key", "present.0.key"),
        ("past_key_values.0.value", "present.0.value"),
    ]
    assert sig.kv_bytes_per_token == 4 * 4 * 16 * 4
    feeds = prefill_feeds(sig, np.zeros((2, 3), np.int64))
    assert feeds["past_key_values.1.value"].shape == (2, 4, 0, 16)
    assert feeds["position_ids"].tolist() == [[0, 1, 2], [0, 1, 2]]


def test_stacked_gpt2_cache_form():
    """GPT-2's legacy export: past_N [2, batch, heads, past, head] and present_N."""
    x = oh.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "s"])
    past = oh.make_tensor_value_info("past_0", TensorProto.FLOAT, [2, "b", 4, "p", 8])
    logits = oh.make_tensor_value_info("logits", TensorProto.FLOAT, ["b", "s", 10])
    present = oh.make_tensor_value_info("present_0", TensorProto.FLOAT, [2, "b", 4, "t", 8])
    graph = oh.make_graph([], "g", [x, past], [logits, present])
    sig = decoder_signature(make_model(graph))
    assert sig.caches[0].batch_axis == 1 and sig.caches[0].seq_axis == 3
    assert sig.caches[0].present == "present_0"
    assert sig.kv_bytes_per_token == 2 * 4 * 8 * 4


def test_not_a_decoder_is_refused(tmp_path):
    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
    )
    path = tmp_path / "relu.onnx"
    onnx.save(make_model(graph), path)
    done = run_cli("bench", str(path), "--generate", "4")
    assert done.returncode == 2
    assert "no KV-cache inputs and outputs" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_prompt_files(tmp_path, decoder_path):
    text = tmp_path / "p.txt"
    text.write_text("1, 2 3\n4\n")
    assert read_prompt(text).tolist() == [[1, 2, 3, 4]]
    npy = tmp_path / "p.npy"
    np.save(npy, np.array([[5, 6], [7, 8]], np.int32))
    assert read_prompt(npy).tolist() == [[5, 6], [7, 8]]
    report = generate(decoder_path, 2, prompt=read_prompt(npy), warmup=0, runs=1, memory=False)
    assert report.batch == 2 and report.prompt_len == 2


@pytest.mark.parametrize(
    "content, message",
    [("1 2 three", "holds 'three', not a token id"), ("1.5 2", "holds '1.5'"), ("", "no token")],
)
def test_bad_prompt_files_exit_2(tmp_path, decoder_path, content, message):
    path = tmp_path / "p.txt"
    path.write_text(content)
    done = run_cli("bench", str(decoder_path), "--generate", "2", "--prompt", str(path))
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_prompt_out_of_vocabulary(tmp_path, decoder_path):
    path = tmp_path / "p.txt"
    path.write_text("1 2 50")
    with pytest.raises(InferccError, match=r"outside the vocabulary \[0, 50\)"):
        generate(decoder_path, 2, prompt=read_prompt(path), memory=False)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prompt-len", "4"], "--prompt-len needs --generate"),
        (["--generate", "2", "--batch", "1,2"], "one batch size"),
        (["--generate", "2", "--shape", "input_ids=1x3"], "--shape has no effect"),
        (["--spin"], "--spin needs --generate"),
        (["--generate", "2", "--spin", "--compare", "SELF"], "--spin has no effect with --compare"),
    ],
)
def test_flag_errors(decoder_path, args, message):
    args = [str(decoder_path) if a == "SELF" else a for a in args]
    done = run_cli("bench", str(decoder_path), *args)
    assert done.returncode == 2
    assert message in done.stderr


def test_cli_json(decoder_path):
    done = run_cli(
        "bench",
        str(decoder_path),
        *QUICK,
        "--json",
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["new_tokens"] == 3 and data["steps"] == 2 and data["memory"] is None
    assert {"ttft_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "decode_tokens_per_s"} <= set(
        data
    )


def test_the_loop_does_not_spin_unless_asked(decoder_path, monkeypatch):
    """The decode loop's sessions keep onnxruntime's idle threads from spinning between
    steps; --spin (spinning=True) gives onnxruntime's default; the report says which."""
    from infercc.runtime import generate as gen

    opened = []
    real = gen.Decoder.__init__

    def spy(self, *args, **kwargs):
        real(self, *args, **kwargs)
        opts = self.session.get_session_options()
        try:
            opened.append(opts.get_session_config_entry("session.intra_op.allow_spinning"))
        except RuntimeError:  # not set: onnxruntime's default, spinning
            opened.append(None)

    monkeypatch.setattr(gen.Decoder, "__init__", spy)
    quiet = generate(decoder_path, 2, prompt_len=3, warmup=0, runs=1, memory=False)
    spun = generate(decoder_path, 2, prompt_len=3, warmup=0, runs=1, memory=False, spinning=True)
    assert opened[:2] == ["0", None]
    assert quiet.to_dict()["spinning"] is False and spun.to_dict()["spinning"] is True
    done = run_cli(
        "bench",
        str(decoder_path),
        "--generate",
        "2",
        "--prompt-len",
        "3",
        "--iters",
        "1",
        "--warmup",
        "0",
        "--no-memory",
        "--spin",
    )
    assert done.returncode == 0, done.stderr
    assert "threads spinning (--spin)" in done.stdout
    assert opened[2] is None


def _fixed(model: onnx.ModelProto, dims: dict[str, dict[int, int]]) -> onnx.ModelProto:
    """`model` with input `name`'s axis `axis` declared static at `size`."""
    for vi in model.graph.input:
        for axis, size in dims.get(vi.name, {}).items():
            vi.type.tensor_type.shape.dim[axis].Clear()
            vi.type.tensor_type.shape.dim[axis].dim_value = size
    return model


@pytest.mark.parametrize("batch", [None, 2])
def test_a_decode_step_graph_is_fed_its_prompt_token_by_token(tmp_path, decoder_path, batch):
    """input_ids (and position_ids) static at [batch, 1], as a decode-step export declares
    them (batch symbolic, or static on every input): the prompt goes in one token per call,
    and the tokens equal the dynamic graph's."""
    model = tiny_decoder()
    dims = {"input_ids": {1: 1}, "position_ids": {1: 1}}
    if batch is not None:
        for vi in model.graph.input:
            dims.setdefault(vi.name, {})[0] = batch
    path = tmp_path / "step.onnx"
    onnx.save(_fixed(model, dims), path)
    prompt = np.random.default_rng(2).integers(0, 50, (batch or 3, 6))
    report = generate(path, 5, prompt=prompt, warmup=0, runs=1, memory=False)
    assert report.prefill == "token by token" and report.to_dict()["prefill"] == "token by token"
    assert report.stats.tokens == greedy_reference(decoder_path, prompt, 5).tolist()
    assert generate(decoder_path, 2, prompt_len=3, warmup=0, runs=1, memory=False).prefill == (
        "one call"
    )
    if batch == 2:  # the declared batch is the default, another is refused by name
        assert generate(path, 2, prompt_len=3, warmup=0, runs=1, memory=False).batch == 2
        with pytest.raises(InferccError, match="--batch 3: input 'input_ids' is declared"):
            generate(path, 2, prompt_len=3, batch=3, warmup=0, runs=1, memory=False)
    done = run_cli(
        "bench",
        str(path),
        *QUICK,
    )
    assert done.returncode == 0, done.stderr
    assert "fed token by token" in done.stdout


@pytest.mark.parametrize(
    "dims, message",
    [
        ({"input_ids": {1: 4}, "position_ids": {1: 4}}, "input 'input_ids' is declared [batch, 4]"),
        (
            {f"past_key_values.{i}.{kv}": {2: 8} for i in range(2) for kv in ("key", "value")},
            "cache input 'past_key_values.0.key' has dims ['batch', 4, 8, 16]",
        ),
        (
            {"attention_mask": {1: 8}},
            "input 'attention_mask' is declared [batch, 8]: a fixed mask length",
        ),
    ],
)
def test_a_decoder_that_cannot_generate_names_the_input_and_shape(tmp_path, dims, message):
    path = tmp_path / "fixed.onnx"
    onnx.save(_fixed(tiny_decoder(), dims), path)
    done = run_cli("bench", str(path), "--generate", "3", "--no-memory")
    assert done.returncode == 2, done.stderr
    assert message in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_a_run_that_onnxruntime_refuses_names_what_was_fed(decoder_path, monkeypatch):
    from infercc.runtime import generate as gen

    decoder = gen.open_decoder(decoder_path)

    def refuse(*_args):
        raise RuntimeError("Got invalid dimensions for input: input_ids")

    monkeypatch.setattr(decoder.session, "run_with_ort_values", refuse)
    with pytest.raises(InferccError) as err:
        decoder.prefill(np.zeros((1, 3), np.int64))
    assert "invalid dimensions for input: input_ids" in err.value.message
    assert "input_ids [1, 3] (declared ['batch', 'seq'])" in str(err.value)


def test_peak_memory_is_the_childs_own_not_its_parents(decoder_path):
    """ru_maxrss survives exec: a child of a large process read its parent's peak. The child
    now reads its own high-water mark (VmHWM)."""
    from infercc.runtime.generate import _rss_now

    ballast = np.ones(50_000_000)  # 400 MB touched in this process
    parent = _rss_now()
    report = generate(decoder_path, 3, prompt_len=4, warmup=0, runs=1, memory=True)
    assert report.stats.memory.peak_rss_bytes < parent / 2, (report.stats.memory, parent)
    del ballast
