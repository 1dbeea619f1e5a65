"""Images as calibration samples: a `--preprocess` spec, and a lazy image-to-tensor reader.

The spec is a comma-separated list of `key=value` items and at most one preset name::

    imagenet,crop=256
    resize=256,crop=224,mean=0.485/0.456/0.406,std=0.229/0.224/0.225,scale=1/255,order=rgb

The preset is applied first, explicit keys override it, whatever their position. Keys:

- `input=NAME`: the input the images feed (default: the model's only rank-4 input).
- `resize=S | HxW | none | auto`: `S` resizes the shorter side to S keeping the aspect ratio
  (torchvision `Resize(S)`: the longer side becomes `int(S * long / short)`), `HxW` to exactly
  that size. `auto` (the default) is `int(max(crop) / 0.875)` when there is a crop (224 -> 256,
  the torchvision ImageNet evaluation), none otherwise.
- `crop=S | HxW | none | auto`: a center crop (torchvision `CenterCrop`: top-left offset
  `round((size - crop) / 2)`). `auto` (the default) is the model's static height and width.
- `scale=F | A/B`: pixels (0..255) are multiplied by A then divided by B, in float32 (`1/255`
  divides by 255, as torchvision's `ToTensor`). Default 1.
- `mean=M[/M...]`, `std=S[/S...]`: then `(x - mean) / std` per channel, float32 (torchvision
  `Normalize`). One value, or one per channel, always listed in R/G/B order whatever `order`.
- `order=rgb | bgr | gray`: the channel order the model receives (gray: one channel).
- `layout=nchw | nhwc`: default from the model's input shape (NHWC when only the last axis
  looks like channels, 1 or 3; NCHW otherwise).
- `dtype=float32 | float16 | float64 | uint8 | int8 | ...`: default the model input's type.
  Integer types round and clip.
- `interp=bilinear | bicubic | nearest | lanczos`: the resize filter (default bilinear, as
  torchvision).

Presets: `imagenet` = `scale=1/255,mean=0.485/0.456/0.406,std=0.229/0.224/0.225,order=rgb`
with the automatic resize and crop (torchvision's standard ImageNet evaluation transform), and
`raw` = the defaults (pixels 0..255 as the model's dtype, RGB, only the resize and crop the
model's shape needs).

Each image is opened, converted to RGB (or L for gray) as torchvision's loader does, resized,
cropped and normalized; when the model fixes its batch dimension to B > 1, B consecutive
images make one sample (an incomplete last batch is dropped). Files are read in name order,
one at a time, so a caller that stops after N samples reads only the first N images.
Pillow is an optional dependency: `pip install "infercc[images]"`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx

from infercc.data.signature import _format_dims, declared_dims, input_dtype, real_inputs
from infercc.errors import InferccError

logger = logging.getLogger(__name__)

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp"})
CROP_FRACTION = 0.875  # torchvision / timm: resize to crop / 0.875, then center-crop

Size = tuple[int, int]  # (height, width); a single int S is stored as (S, 0): shorter side
Auto = Literal["auto"]
AUTO: Auto = "auto"

PRESETS = {
    "imagenet": "scale=1/255,mean=0.485/0.456/0.406,std=0.229/0.224/0.225,order=rgb",
    "raw": "",
}
# The crop a preset's `crop=auto` takes on an axis the model leaves symbolic (a warning says so).
PRESET_SIZES: dict[str, Size] = {"imagenet": (224, 224)}
KEYS = ("input", "resize", "crop", "scale", "mean", "std", "order", "layout", "dtype", "interp")
ORDERS = ("rgb", "bgr", "gray")
LAYOUTS = ("nchw", "nhwc")
INTERPOLATIONS = ("bilinear", "bicubic", "nearest", "lanczos")
_HINT = "see infercc calibrate --help for --preprocess keys and presets (imagenet, raw)"


@dataclass(frozen=True)
class Preprocess:
    """A parsed `--preprocess` spec; `auto`/None fields are resolved against the model."""

    input: str | None = None
    resize: Size | None | Auto = AUTO
    crop: Size | None | Auto = AUTO
    scale: tuple[float, float] = (1.0, 1.0)  # multiply by [0], divide by [1]
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    order: str = "rgb"
    layout: str | None = None
    dtype: str | None = None
    interp: str = "bilinear"
    symbolic_size: Size | None = None  # crop=auto's H x W where the model's are symbolic


# --------------------------------------------------------------------------- the spec


def parse_preprocess(spec: str) -> Preprocess:
    """Parse a spec (module docstring); InferccError naming the bad item."""
    preset, items = _split_spec(spec)
    result = parse_preprocess(PRESETS[preset]) if preset else Preprocess()
    if preset in PRESET_SIZES:
        result = replace(result, symbolic_size=PRESET_SIZES[preset])
    fields = {key: _parse_value(key, value) for key, value in items.items()}
    return replace(result, **fields)


def _split_spec(spec: str) -> tuple[str | None, dict[str, str]]:
    preset: str | None = None
    items: dict[str, str] = {}
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        if "=" not in item:
            preset = _check_preset(item, preset)
            continue
        key, value = (part.strip() for part in item.split("=", 1))
        if key.lower() in items:
            raise InferccError(f"--preprocess gives {key!r} twice", _HINT)
        items[_check_key(key)] = value
    return preset, items


def _check_preset(name: str, previous: str | None) -> str:
    if name.lower() not in PRESETS:
        raise InferccError(
            f"--preprocess: unknown preset or item {name!r}",
            f"presets: {', '.join(PRESETS)}; other items are key=value with key in "
            f"{', '.join(KEYS)}",
        )
    if previous is not None:
        raise InferccError(f"--preprocess names two presets ({previous}, {name})", "pick one")
    return name.lower()


def _check_key(key: str) -> str:
    if key.lower() not in KEYS:
        raise InferccError(
            f"--preprocess: unknown key {key!r}", f"keys: {', '.join(KEYS)}; {_HINT}"
        )
    return key.lower()


def _parse_value(key: str, value: str) -> Any:
    parsers = {
        "input": _parse_name,
        "resize": _parse_size,
        "crop": _parse_size,
        "scale": _parse_scale,
        "mean": _parse_floats,
        "std": _parse_floats,
        "order": lambda k, v: _parse_choice(k, v, ORDERS),
        "layout": lambda k, v: _parse_choice(k, v, LAYOUTS),
        "dtype": _parse_dtype,
        "interp": lambda k, v: _parse_choice(k, v, INTERPOLATIONS),
    }
    return parsers[key](key, value)


def _bad(key: str, value: str, expected: str) -> InferccError:
    return InferccError(f"--preprocess: bad {key}={value!r}", f"expected {expected}")


def _parse_name(key: str, value: str) -> str:
    if not value:
        raise _bad(key, value, "an input name")
    return value


def _parse_size(key: str, value: str) -> Size | None | Auto:
    text = value.lower()
    if text in ("none", "auto"):
        return None if text == "none" else AUTO
    parts = text.split("x")
    try:
        dims = [int(p) for p in parts]
    except ValueError:
        dims = []
    if len(dims) not in (1, 2) or any(d < 1 for d in dims):
        raise _bad(key, value, "S (shorter side), HxW, none or auto, with positive integers")
    return (dims[0], 0) if len(dims) == 1 else (dims[0], dims[1])


def _parse_scale(key: str, value: str) -> tuple[float, float]:
    parts = value.split("/")
    try:
        num, den = float(parts[0]), float(parts[1]) if len(parts) == 2 else 1.0
    except (ValueError, IndexError):
        num = den = math.nan
    if len(parts) > 2 or not (math.isfinite(num) and math.isfinite(den)) or num == 0 or den == 0:
        raise _bad(key, value, "a non-zero number or fraction, e.g. 1/255 or 0.0039")
    return num, den


def _parse_floats(key: str, value: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in value.split("/"))
    except ValueError:
        values = ()
    if not values or not all(math.isfinite(v) for v in values):
        raise _bad(key, value, "one number or one per channel separated by '/', e.g. 0.5/0.5/0.5")
    if key == "std" and any(v == 0 for v in values):
        raise _bad(key, value, "non-zero standard deviations")
    return values


def _parse_choice(key: str, value: str, choices: tuple[str, ...]) -> str:
    if value.lower() not in choices:
        raise _bad(key, value, " or ".join(choices))
    return value.lower()


def _parse_dtype(key: str, value: str) -> str:
    try:
        dtype = np.dtype(value.lower())
    except TypeError:
        dtype = np.dtype(object)
    if dtype.kind not in "fiu":
        raise _bad(key, value, "a numeric type such as float32, float16 or uint8")
    return dtype.name


# --------------------------------------------------------------------------- the plan


@dataclass(frozen=True)
class ImagePlan:
    """A spec resolved against the model: what each image becomes, exactly."""

    input: str
    rank: int  # 4 (with a batch axis) or 3
    batch: int  # images per sample
    layout: str
    order: str
    resize: Size | None
    crop: Size | None
    scale: tuple[float, float]
    mean: np.ndarray | None  # float32, one per output channel, in R/G/B order
    std: np.ndarray | None
    dtype: np.dtype
    interp: str

    @property
    def shape(self) -> tuple[int | None, ...]:
        """The shape of one sample (None: each image's own height or width)."""
        n = 1 if self.order == "gray" else 3
        height, width = _final_size(self.resize, self.crop) or (None, None)
        hw = (height, width)
        chw = (n, *hw) if self.layout == "nchw" else (*hw, n)
        return (self.batch, *chw) if self.rank == 4 else chw

    def describe(self) -> str:
        """`images -> x float32[1,3,224,224]` (`?`: each image's own size)."""
        dims = ",".join("?" if d is None else str(d) for d in self.shape)
        return f"images -> {self.input} {self.dtype.name}[{dims}]"


def plan_images(spec: Preprocess, model: onnx.ModelProto) -> ImagePlan:
    """Resolve `auto` sizes, the layout, the dtype and the batch from the model's input; warn
    where the model leaves height or width symbolic and the spec does not fix them."""
    vi = _image_input(spec.input, model)
    dims = declared_dims(vi) or []
    layout = spec.layout or _guess_layout(dims)
    channels, height, width = _chw(dims, layout)
    _check_channels(vi.name, channels, spec.order)
    crop = (height, width) if spec.crop == AUTO and height and width else spec.crop
    symbolic = spec.crop == AUTO and not (height and width)
    if symbolic and spec.symbolic_size is not None:
        crop = (height or spec.symbolic_size[0], width or spec.symbolic_size[1])
    crop = None if crop == AUTO else crop
    resize = _auto_resize(crop) if spec.resize == AUTO else spec.resize
    _check_size(vi.name, dims, resize, crop, height, width)
    batch = dims[0] if len(dims) == 4 and isinstance(dims[0], int) and dims[0] > 0 else 1
    n = 1 if spec.order == "gray" else 3
    plan = ImagePlan(
        input=vi.name,
        rank=len(dims),
        batch=batch,
        layout=layout,
        order=spec.order,
        resize=resize,
        crop=crop,
        scale=spec.scale,
        mean=_per_channel("mean", spec.mean, n),
        std=_per_channel("std", spec.std, n),
        dtype=np.dtype(spec.dtype) if spec.dtype else input_dtype(vi),
        interp=spec.interp,
    )
    if symbolic and (crop is not None or spec.resize in (AUTO, None)):
        _warn_symbolic(plan, dims)
    return plan


def _warn_symbolic(plan: ImagePlan, dims: list[int | str | None]) -> None:
    how = (
        "each image keeps its own size; give crop=HxW or resize=HxW"
        if plan.crop is None
        else "give crop=HxW"
    )
    logger.warning(
        "input %r has a symbolic height or width (%s): %s; %s for the size the model runs at",
        plan.input,
        _format_dims(dims),
        plan.describe(),
        how,
    )


def _image_input(name: str | None, model: onnx.ModelProto) -> onnx.ValueInfoProto:
    inputs = real_inputs(model)
    names = ", ".join(vi.name for vi in inputs) or "(none)"
    if name is not None:
        chosen = [vi for vi in inputs if vi.name == name]
        if not chosen:
            raise InferccError(f"--preprocess input={name!r} is not a model input", names)
    else:
        chosen = [vi for vi in inputs if len(declared_dims(vi) or []) == 4]
        if len(chosen) != 1:
            raise InferccError(
                f"images need one image-like (rank-4) input; the model has {len(chosen)}",
                f"name it with --preprocess input=NAME (inputs: {names})",
            )
    _check_image_input(chosen[0], inputs)
    return chosen[0]


def _check_image_input(vi: onnx.ValueInfoProto, inputs: list[onnx.ValueInfoProto]) -> None:
    others = [other.name for other in inputs if other.name != vi.name]
    if others:
        raise InferccError(
            f"images feed input {vi.name!r} only; the model also needs {', '.join(others)}",
            "pass .npz samples holding every input instead of images",
        )
    rank = len(declared_dims(vi) or [])
    if rank not in (3, 4):
        raise InferccError(
            f"images feed rank-3 or rank-4 inputs; {vi.name!r} has rank {rank or 'unknown'}",
            "pass .npz samples instead of images",
        )


def _guess_layout(dims: list[int | str | None]) -> str:
    first, last = dims[-3], dims[-1]
    if last in (1, 3) and first not in (1, 3):
        return "nhwc"
    return "nchw"


def _chw(dims: list[int | str | None], layout: str) -> tuple[int | None, ...]:
    c, h, w = (dims[-3], dims[-2], dims[-1]) if layout == "nchw" else (dims[-1], *dims[-3:-1])
    return tuple(d if isinstance(d, int) and d > 0 else None for d in (c, h, w))


def _check_channels(name: str, channels: int | None, order: str) -> None:
    want = 1 if order == "gray" else 3
    if channels is not None and channels != want:
        raise InferccError(
            f"input {name!r} has {channels} channel(s); order={order} gives {want}",
            "use order=gray for 1 channel, rgb or bgr for 3, or check layout=nchw|nhwc",
        )


def _auto_resize(crop: Size | None) -> Size | None:
    if crop is None:
        return None
    return (int(max(crop) / CROP_FRACTION), 0)


def _final_size(resize: Size | None, crop: Size | None) -> Size | None:
    """The (H, W) every image ends with, when the spec fixes it regardless of the image."""
    size = crop or resize
    if size is None:
        return None
    return (size[0], size[0]) if size[1] == 0 else size


def _check_size(
    name: str,
    dims: list[int | str | None],
    resize: Size | None,
    crop: Size | None,
    height: int | None,
    width: int | None,
) -> None:
    if crop is None and resize is not None and resize[1] == 0 and (height or width):
        raise InferccError(
            f"resize={resize[0]} keeps each image's aspect ratio, but input {name!r} "
            f"fixes its size ({dims})",
            "add crop=HxW (or crop=auto), or resize to HxW",
        )
    final = _final_size(resize, crop)
    if final is None or (height is None and width is None):
        return
    if (height is not None and final[0] != height) or (width is not None and final[1] != width):
        raise InferccError(
            f"--preprocess makes {final[0]}x{final[1]} images, input {name!r} needs "
            f"{height or '?'}x{width or '?'} (H x W)",
            "set crop=HxW to the model's size, or crop=auto",
        )


def _per_channel(key: str, values: tuple[float, ...] | None, n: int) -> np.ndarray | None:
    if values is None:
        return None
    if len(values) not in (1, n):
        raise InferccError(
            f"--preprocess {key} has {len(values)} values for {n} channel(s)",
            f"give 1 or {n} values separated by '/'",
        )
    return np.asarray(values * n if len(values) == 1 else values, np.float32)


# --------------------------------------------------------------------------- reading images


def import_pil() -> Any:
    """`PIL.Image`, or a one-line InferccError saying how to install it."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise InferccError(
            "reading images needs Pillow, which is not installed",
            'pip install "infercc[images]"',
        ) from exc
    return Image


def is_image(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_SUFFIXES


def load_image(path: Path, plan: ImagePlan) -> np.ndarray:
    """One image as an array of the plan's layout without the batch axis (CHW or HWC)."""
    pixels = _read_pixels(path, plan)
    x = pixels.astype(np.float32)
    num, den = plan.scale
    if num != 1:
        x = x * np.float32(num)
    if den != 1:
        x = x / np.float32(den)
    if plan.mean is not None:
        x = x - plan.mean
    if plan.std is not None:
        x = x / plan.std
    if plan.order == "bgr":
        x = x[:, :, ::-1]
    if plan.layout == "nchw":
        x = x.transpose(2, 0, 1)
    return _cast(x, plan.dtype)


def _read_pixels(path: Path, plan: ImagePlan) -> np.ndarray:
    """uint8 HxWxC pixels after convert, resize and crop (C is 1 for gray)."""
    image_mod = import_pil()
    try:
        with image_mod.open(path) as opened:
            image = opened.convert("L" if plan.order == "gray" else "RGB")
    except (OSError, ValueError, SyntaxError) as exc:  # UnidentifiedImageError is an OSError
        raise InferccError(
            f"cannot read image {str(path)!r}: {exc}", "is it a jpg, png, bmp or webp file?"
        ) from exc
    image = _resize(image, plan.resize, _resample(image_mod, plan.interp))
    if plan.crop is not None:
        image = _center_crop(path, image, plan.crop)
    pixels = np.asarray(image, dtype=np.uint8)
    return pixels[:, :, None] if pixels.ndim == 2 else pixels


def _resample(image_mod: Any, interp: str) -> Any:
    return getattr(image_mod.Resampling, interp.upper())


def resized_size(width: int, height: int, size: Size) -> tuple[int, int]:
    """(width, height) after `resize`, torchvision's rule for a single int (shorter side)."""
    if size[1]:
        return size[1], size[0]
    short, long = sorted((width, height))
    new_short, new_long = size[0], int(size[0] * long / short)
    return (new_short, new_long) if width <= height else (new_long, new_short)


def _resize(image: Any, size: Size | None, resample: Any) -> Any:
    if size is None:
        return image
    new = resized_size(image.width, image.height, size)
    return image if new == image.size else image.resize(new, resample)


def _center_crop(path: Path, image: Any, crop: Size) -> Any:
    height, width = (crop[0], crop[0]) if crop[1] == 0 else crop
    if height > image.height or width > image.width:
        raise InferccError(
            f"image {str(path)!r} is {image.width}x{image.height} (W x H), smaller than the "
            f"{width}x{height} crop",
            "resize it first (resize=S or resize=auto)",
        )
    top = int(round((image.height - height) / 2.0))
    left = int(round((image.width - width) / 2.0))
    return image.crop((left, top, left + width, top + height))


def _cast(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        x = np.clip(np.rint(x), info.min, info.max)
    return np.ascontiguousarray(x.astype(dtype))


def iter_image_samples(
    files: Iterable[Path], model: onnx.ModelProto, preprocess: str | Preprocess
) -> Iterator[tuple[Path, dict[str, np.ndarray]]]:
    """(first file, sample) per image, or per `batch` images when the model fixes batch > 1.

    Lazy: an image is read only when the next sample is asked for.
    """
    spec = parse_preprocess(preprocess) if isinstance(preprocess, str) else preprocess
    plan = plan_images(spec, model)
    import_pil()  # fail before the first file, not inside the loop
    logger.info("%s: %s", plan.describe(), plan)
    pending: list[tuple[Path, np.ndarray]] = []
    for path in files:
        pending.append((path, load_image(path, plan)))
        if len(pending) == plan.batch:
            yield pending[0][0], {plan.input: _batch(pending, plan)}
            pending = []
    if pending:
        logger.warning(
            "dropped the last %d image(s): input %r takes batches of %d",
            len(pending),
            plan.input,
            plan.batch,
        )


def _batch(images: list[tuple[Path, np.ndarray]], plan: ImagePlan) -> np.ndarray:
    arrays = [array for _, array in images]
    return np.stack(arrays) if plan.rank == 4 else arrays[0]
