"""The models of `bench/shape_zoo.py`: small, random-weight versions of today's architectures,
exported by torch.onnx (TorchScript exporter, and `dynamo=True` where asked).

Every model keeps its architecture's graph structure (attention with its head split and
masks, KV caches, windows, relative position buckets, anchors) at a few layers and small
widths, so an export takes seconds on two cores. Nothing is downloaded: configurations are
written here and weights are random (biases and norm parameters too, as a trained model's
would be: an all-zero bias would let an optimizer delete Adds no real model lets it delete).

Each entry gives the export and the symbolic dimensions' values at two profiles; inputs are
generated from them (`feeds`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


def _torch():
    import torch

    try:  # a working torchvision registers its own ops
        import torchvision  # noqa: F401

        warnings.filterwarnings("ignore")
        return torch
    except Exception:
        pass
    try:  # torchvision's CPU ops may be absent here: timm and transformers only need schemas
        lib = torch.library.Library("torchvision", "DEF")
        lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _torch.lib = lib  # type: ignore[attr-defined]
    except RuntimeError:
        pass
    warnings.filterwarnings("ignore")
    return torch


@dataclass
class ZooModel:
    name: str
    export: Callable[[Path], None]
    profiles: tuple[dict[str, int], dict[str, int]]
    vocab: int = 1000
    static: dict[str, int] = field(default_factory=dict)  # the --static-shapes profile


def _trained_like(model) -> None:
    """Random biases and norm parameters (HF and timm init biases to 0, norms to 1)."""
    torch = _torch()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(p + 0.05 * torch.randn(p.shape, generator=g))


def _export(module, args, path: Path, names, dyn, dynamo: bool = False, out_names=None) -> None:
    torch = _torch()
    module.eval()
    _trained_like(module)
    if not dynamo:
        torch.onnx.export(
            module,
            tuple(args),
            str(path),
            input_names=names,
            output_names=out_names,
            dynamic_axes=dyn,
            opset_version=17,
            dynamo=False,
        )
        return
    from torch.export import Dim

    dims: dict[str, object] = {}
    shapes = {}
    for n in names:
        axes = dyn.get(n, {})
        shapes[n] = {a: dims.setdefault(d, Dim(d, min=1, max=4096)) for a, d in axes.items()}
    program = torch.onnx.export(
        module,
        tuple(args),
        input_names=names,
        output_names=out_names,
        dynamic_shapes=shapes,
        opset_version=18,
        dynamo=True,
        verbose=False,
    )
    program.save(str(path))


# -- transformers ------------------------------------------------------------------------------


def _decoder(kind: str, cache: bool) -> Callable[[Path], None]:
    def export(path: Path) -> None:
        torch = _torch()
        import transformers as tf

        if kind == "gpt2":
            cfg = tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=256)
            model = tf.GPT2LMHeadModel(cfg)
            heads, hd = 4, 16
        else:
            cfg = tf.LlamaConfig(
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                vocab_size=1000,
                max_position_embeddings=256,
            )
            model = tf.LlamaForCausalLM(cfg)
            heads, hd = 2, 16
        layers = 2

        class WithCache(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, input_ids, attention_mask, *past):
                kv = None
                if past:
                    kv = tf.DynamicCache(config=cfg)
                    for i in range(len(past) // 2):
                        kv.update(past[2 * i], past[2 * i + 1], i)
                out = self.m(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    past_key_values=kv,
                    use_cache=bool(past),
                )
                if not past:
                    return out.logits
                present = [
                    t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)
                ]
                return (out.logits, *present)

        ids = torch.randint(0, 1000, (2, 5))
        names = ["input_ids", "attention_mask"]
        dyn = {"input_ids": {0: "batch", 1: "seq"}}
        if cache:
            past = [torch.randn(2, heads, 3, hd) for _ in range(2 * layers)]
            mask = torch.ones(2, 8, dtype=torch.int64)
            pnames = [f"past_{i // 2}_{'kv'[i % 2]}" for i in range(2 * layers)]
            names += pnames
            dyn["attention_mask"] = {0: "batch", 1: "total"}
            dyn.update({n: {0: "batch", 2: "past"} for n in pnames})
            _export(WithCache(model), [ids, mask, *past], path, names, dyn)
        else:
            mask = torch.ones(2, 5, dtype=torch.int64)
            dyn["attention_mask"] = {0: "batch", 1: "seq"}
            _export(WithCache(model), [ids, mask], path, names, dyn)

    return export


def _encoder(kind: str) -> Callable[[Path], None]:
    def export(path: Path) -> None:
        torch = _torch()
        import transformers as tf

        seq = {0: "batch", 1: "seq"}
        if kind == "distilbert":
            cfg = tf.DistilBertConfig(
                vocab_size=1000, dim=64, n_layers=2, n_heads=4, hidden_dim=128
            )
            model = tf.DistilBertModel(cfg)
        elif kind == "t5":
            cfg = tf.T5Config(
                vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4
            )
            model = tf.T5EncoderModel(cfg)
        if kind in ("distilbert", "t5"):

            class Enc(torch.nn.Module):
                def __init__(self, m):
                    super().__init__()
                    self.m = m

                def forward(self, input_ids, attention_mask):
                    return self.m(input_ids=input_ids, attention_mask=attention_mask)[0]

            ids = torch.randint(0, 1000, (2, 7))
            mask = torch.ones(2, 7, dtype=torch.int64)
            names = ["input_ids", "attention_mask"]
            _export(Enc(model), [ids, mask], path, names, {n: seq for n in names})
            return
        if kind == "whisper":
            cfg = tf.WhisperConfig(
                d_model=64,
                encoder_layers=2,
                encoder_attention_heads=4,
                encoder_ffn_dim=128,
                decoder_layers=1,
                decoder_attention_heads=4,
                decoder_ffn_dim=128,
                num_mel_bins=16,
                max_source_positions=32,
                vocab_size=1000,
                pad_token_id=0,
                bos_token_id=1,
                eos_token_id=2,
                decoder_start_token_id=1,
            )
            model = tf.WhisperModel(cfg).get_encoder()

            class Enc(torch.nn.Module):
                def __init__(self, m):
                    super().__init__()
                    self.m = m

                def forward(self, input_features):
                    return self.m(input_features=input_features)[0]

            x = torch.randn(2, 16, 64)
            _export(Enc(model), [x], path, ["input_features"], {"input_features": {0: "batch"}})
            return
        if kind == "segformer":  # reduced-KV attention: K and V from a strided Conv of X
            cfg = tf.SegformerConfig(
                num_encoder_blocks=2,
                depths=[1, 1],
                sr_ratios=[4, 2],
                hidden_sizes=[16, 32],
                num_attention_heads=[1, 2],
                decoder_hidden_size=32,
                num_labels=4,
            )
            model = tf.SegformerForSemanticSegmentation(cfg)

            class Seg(torch.nn.Module):
                def __init__(self, m):
                    super().__init__()
                    self.m = m

                def forward(self, pixel_values):
                    return self.m(pixel_values=pixel_values).logits

            x = torch.randn(2, 3, 64, 64)
            _export(Seg(model), [x], path, ["pixel_values"], {"pixel_values": {0: "batch"}})
            return
        if kind == "vit":
            cfg = tf.ViTConfig(
                image_size=32,
                patch_size=8,
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=128,
            )
            model = tf.ViTModel(cfg, add_pooling_layer=False)
        else:
            cfg = tf.SwinConfig(
                image_size=32,
                patch_size=2,
                embed_dim=16,
                depths=[2, 2],
                num_heads=[2, 4],
                window_size=4,
            )
            model = tf.SwinModel(cfg, add_pooling_layer=False)

        class Img(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, pixel_values):
                return self.m(pixel_values=pixel_values)[0]

        x = torch.randn(2, 3, 32, 32)
        _export(Img(model), [x], path, ["pixel_values"], {"pixel_values": {0: "batch"}})

    return export


# -- timm --------------------------------------------------------------------------------------


def _timm(arch: str, dynamo: bool) -> Callable[[Path], None]:
    def export(path: Path) -> None:
        torch = _torch()
        import timm

        kwargs = {
            "vit": dict(img_size=64, patch_size=16, embed_dim=64, depth=2, num_heads=4),
            "swin": dict(
                img_size=64,
                patch_size=4,
                window_size=4,
                embed_dim=16,
                depths=(2, 2),
                num_heads=(2, 4),
            ),
            "convnext": dict(depths=(1, 1, 2, 1), dims=(16, 32, 64, 128)),
            # mobile ViT attention (unfold, transformer, fold) and LeViT's attention with
            # its Slice-built heads: timm's small configs as they are, at 64x64
            "mobilevit": {},
            "levit": dict(img_size=64),
        }[arch]
        name = {
            "vit": "vit_tiny_patch16_224",
            "swin": "swin_tiny_patch4_window7_224",
            "convnext": "convnext_atto",
            "mobilevit": "mobilevit_xxs",
            "levit": "levit_128s",
        }[arch]
        model = timm.create_model(name, pretrained=False, num_classes=10, **kwargs)
        size = 64
        x = torch.randn(2, 3, size, size)
        _export(model, [x], path, ["x"], {"x": {0: "batch"}}, dynamo=dynamo)

    return export


# -- a YOLO-style detector ---------------------------------------------------------------------


def _yolo(path: Path) -> None:
    torch = _torch()
    nn = torch.nn

    class ConvBN(nn.Module):
        def __init__(self, c1, c2, k=1, s=1):
            super().__init__()
            self.conv = nn.Conv2d(c1, c2, k, s, k // 2, bias=False)
            self.bn = nn.BatchNorm2d(c2)
            self.act = nn.SiLU()

        def forward(self, x):
            return self.act(self.bn(self.conv(x)))

    class Bottleneck(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.a, self.b = ConvBN(c, c, 3), ConvBN(c, c, 3)

        def forward(self, x):
            return x + self.b(self.a(x))

    class C2f(nn.Module):
        def __init__(self, c1, c2, n=1):
            super().__init__()
            self.c = c2 // 2
            self.cv1 = ConvBN(c1, 2 * self.c)
            self.cv2 = ConvBN((2 + n) * self.c, c2)
            self.m = nn.ModuleList(Bottleneck(self.c) for _ in range(n))

        def forward(self, x):
            y = list(self.cv1(x).chunk(2, 1))
            y.extend(m(y[-1]) for m in self.m)
            return self.cv2(torch.cat(y, 1))

    class SPPF(nn.Module):
        def __init__(self, c):
            super().__init__()
            self.cv1, self.cv2 = ConvBN(c, c // 2), ConvBN(c * 2, c)
            self.m = nn.MaxPool2d(5, 1, 2)

        def forward(self, x):
            x = self.cv1(x)
            y1 = self.m(x)
            y2 = self.m(y1)
            return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))

    class Detect(nn.Module):
        def __init__(self, nc, chs, reg_max=8):
            super().__init__()
            self.nc, self.reg_max, self.no = nc, reg_max, nc + 4 * reg_max
            self.box = nn.ModuleList(
                nn.Sequential(ConvBN(c, 16, 3), nn.Conv2d(16, 4 * reg_max, 1)) for c in chs
            )
            self.cls = nn.ModuleList(
                nn.Sequential(ConvBN(c, 16, 3), nn.Conv2d(16, nc, 1)) for c in chs
            )
            self.dfl = nn.Conv2d(reg_max, 1, 1, bias=False)
            self.dfl.weight.data[:] = torch.arange(reg_max, dtype=torch.float).view(
                1, reg_max, 1, 1
            )
            self.strides = (8, 16, 32)

        def anchors(self, feats):
            points, strides = [], []
            for f, s in zip(feats, self.strides, strict=True):
                _, _, h, w = f.shape
                sx = torch.arange(w, dtype=f.dtype) + 0.5
                sy = torch.arange(h, dtype=f.dtype) + 0.5
                yy, xx = torch.meshgrid(sy, sx, indexing="ij")
                points.append(torch.stack((xx, yy), -1).view(-1, 2))
                strides.append(torch.full((h * w, 1), s, dtype=f.dtype))
            return torch.cat(points).transpose(0, 1), torch.cat(strides).transpose(0, 1)

        def forward(self, feats):
            b = feats[0].shape[0]
            xs = [torch.cat((self.box[i](f), self.cls[i](f)), 1) for i, f in enumerate(feats)]
            x = torch.cat([x.view(b, self.no, -1) for x in xs], 2)
            box, cls = x.split((4 * self.reg_max, self.nc), 1)
            a = box.shape[2]
            dist = self.dfl(box.view(b, 4, self.reg_max, a).transpose(2, 1).softmax(1)).view(
                b, 4, a
            )
            anchor, stride = self.anchors(feats)
            lt, rb = dist.chunk(2, 1)
            xy = (anchor.unsqueeze(0) - lt + anchor.unsqueeze(0) + rb) / 2
            wh = rb + lt
            return torch.cat((torch.cat((xy, wh), 1) * stride, cls.sigmoid()), 1)

    class Yolo(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(ConvBN(3, 8, 3, 2), ConvBN(8, 16, 3, 2), C2f(16, 16))
            self.p3 = nn.Sequential(ConvBN(16, 32, 3, 2), C2f(32, 32))
            self.p4 = nn.Sequential(ConvBN(32, 64, 3, 2), C2f(64, 64))
            self.p5 = nn.Sequential(ConvBN(64, 64, 3, 2), C2f(64, 64), SPPF(64))
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.h4 = C2f(128, 64)
            self.h3 = C2f(96, 32)
            self.detect = Detect(5, (32, 64, 64))

        def forward(self, x):
            p3 = self.p3(self.stem(x))
            p4 = self.p4(p3)
            p5 = self.p5(p4)
            n4 = self.h4(torch.cat((self.up(p5), p4), 1))
            n3 = self.h3(torch.cat((self.up(n4), p3), 1))
            return self.detect([n3, n4, p5])

    x = torch.randn(2, 3, 64, 96)
    dyn = {"images": {0: "batch", 2: "height", 3: "width"}}
    _export(Yolo(), [x], path, ["images"], dyn)


# -- the zoo -----------------------------------------------------------------------------------

_SEQ = ({"batch": 1, "seq": 8}, {"batch": 3, "seq": 37})
_KV = (
    {"batch": 1, "seq": 1, "past": 7, "total": 8},
    {"batch": 3, "seq": 4, "past": 9, "total": 13},
)
_BATCH = ({"batch": 1}, {"batch": 3})

ZOO: list[ZooModel] = [
    ZooModel("hf_gpt2", _decoder("gpt2", False), _SEQ, static={"batch": 1, "seq": 16}),
    ZooModel(
        "hf_gpt2_kv",
        _decoder("gpt2", True),
        _KV,
        static={"batch": 1, "seq": 1, "past": 15, "total": 16},
    ),
    ZooModel("hf_llama", _decoder("llama", False), _SEQ, static={"batch": 1, "seq": 16}),
    ZooModel(
        "hf_llama_kv",
        _decoder("llama", True),
        _KV,
        static={"batch": 1, "seq": 1, "past": 15, "total": 16},
    ),
    ZooModel("hf_vit", _encoder("vit"), _BATCH, static={"batch": 1}),
    ZooModel("hf_swin", _encoder("swin"), _BATCH, static={"batch": 1}),
    ZooModel("hf_distilbert", _encoder("distilbert"), _SEQ, static={"batch": 1, "seq": 16}),
    ZooModel("hf_t5_encoder", _encoder("t5"), _SEQ, static={"batch": 1, "seq": 16}),
    ZooModel("hf_whisper_encoder", _encoder("whisper"), _BATCH, static={"batch": 1}),
    ZooModel("hf_segformer", _encoder("segformer"), _BATCH, static={"batch": 1}),
    ZooModel("timm_vit", _timm("vit", False), _BATCH, static={"batch": 1}),
    ZooModel("timm_vit_dynamo", _timm("vit", True), _BATCH, static={"batch": 1}),
    ZooModel("timm_swin", _timm("swin", False), _BATCH, static={"batch": 1}),
    ZooModel("timm_swin_dynamo", _timm("swin", True), _BATCH, static={"batch": 1}),
    ZooModel("timm_convnext", _timm("convnext", False), _BATCH, static={"batch": 1}),
    ZooModel("timm_convnext_dynamo", _timm("convnext", True), _BATCH, static={"batch": 1}),
    ZooModel("timm_mobilevit", _timm("mobilevit", False), _BATCH, static={"batch": 1}),
    ZooModel("timm_mobilevit_dynamo", _timm("mobilevit", True), _BATCH, static={"batch": 1}),
    ZooModel("timm_levit", _timm("levit", False), _BATCH, static={"batch": 1}),
    ZooModel("timm_levit_dynamo", _timm("levit", True), _BATCH, static={"batch": 1}),
    ZooModel(
        "yolo",
        _yolo,
        ({"batch": 1, "height": 64, "width": 96}, {"batch": 2, "height": 96, "width": 64}),
        static={"batch": 1, "height": 64, "width": 96},
    ),
]


def feeds(model_path: Path, dims: dict[str, int], vocab: int = 1000, seed: int = 0) -> dict:
    """Inputs for the model at one profile (symbolic dimension name -> size)."""
    import onnx

    rng = np.random.default_rng(seed)
    proto = onnx.load(str(model_path), load_external_data=False)
    out = {}
    for vi in proto.graph.input:
        tt = vi.type.tensor_type
        shape = [
            d.dim_value if d.HasField("dim_value") else dims[d.dim_param] for d in tt.shape.dim
        ]
        if tt.elem_type == onnx.TensorProto.INT64 and "mask" in vi.name:
            arr = np.ones(shape, np.int64)
            if len(shape) == 2 and shape[0] > 1:
                arr[-1, : shape[1] // 3] = 0  # one padded sequence (left padding)
            out[vi.name] = arr
        elif tt.elem_type == onnx.TensorProto.INT64:
            out[vi.name] = rng.integers(0, vocab, shape).astype(np.int64)
        else:
            out[vi.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def static_spec(model_path: Path, dims: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """Input name -> the fixed shape at profile `dims`."""
    import onnx

    proto = onnx.load(str(model_path), load_external_data=False)
    spec = {}
    for vi in proto.graph.input:
        spec[vi.name] = tuple(
            d.dim_value if d.HasField("dim_value") else dims[d.dim_param]
            for d in vi.type.tensor_type.shape.dim
        )
    return spec
