"""`infercc ci`: compile, validate and time many models from one manifest; report for CI.

The manifest is a TOML file (`infercc.toml`), or the `[tool.infercc]` table of a
`pyproject.toml`. Paths in it are relative to the file. A model entry is an
`infercc.config.BuildConfig` (every key of `BuildConfig.to_dict()`, so every option of
`infercc optimize` works here; docs/ci.md lists them) plus ci's own keys (name, path, golden,
reference, latency_budget_ms, baseline, max_slowdown, warmup, iters). Each model's config is
checked when the manifest is read: an option that would have no effect is a bad manifest.

```toml
[ci]                               # optional
out_dir = "build/infercc-ci"       # one artifact per model goes here (the default)
cache_dir = ".infercc-cache"       # the tuning cache [default: $INFERCC_CACHE_DIR, ~/.cache]
warmup = 5                         # benchmark runs, for models with a budget or baseline
iters = 50

[defaults]                         # optional: keys every model inherits
target = "cpu"

[[models]]
name = "small_cnn"                 # default: the file's stem; must be unique
path = "../small_cnn.onnx"
backend = "ort"                    # ort | tensorrt | none (none: an optimized .onnx file)
precision = "fp32"                 # fp32 | fp16 | int8 (int8: the model must already be QDQ)
shapes = { image = "1x3x32x32" }   # or [1, 3, 32, 32], or a range "1x3x32x32:8x3x32x32:..."
data = "samples/"                  # validate on these samples instead of random inputs
golden = "golden/"                 # or against goldens written by `infercc validate`
reference = "model_fp32.onnx"      # validate against this model instead of `path`
atol = 1e-4                        # rtol, min_cosine: defaults follow the precision
tolerances = { logits = "1e-3:1e-2" }   # per output ATOL:RTOL (or {atol=, rtol=})
fold_limit = "1MiB"                # and portable, disable_passes, fp16_io, keep_fp32, ranges...
tensorrt = { workspace = "4GiB", opt_level = 3 }   # with backend = "tensorrt"
latency_budget_ms = 5.0            # fail when the median latency is above it
baseline = "build/last/small_cnn"  # or: fail when slower than this model/artifact by more
max_slowdown = 1.10                #     than this ratio (median of interleaved pairs)

[ray]                              # optional: for `infercc ci --ray` (infercc.ci.cluster)
shared_storage = false             # every node sees these paths: workers read and write them
cpus = 1                           # CPUs each model's task asks for
max_retries = 2                    # reruns of a task whose worker or node was lost
```

Each model is compiled with `infercc.api.optimize` (its own validation gates the write), then
its output is validated through the runner of its backend (`infercc.check.candidates`), so what
is checked is what will be deployed. Models run in parallel with `jobs > 1` (one process
each, `spawn`ed, so a crash, even a segfault, fails that model only); every exception is
caught per model and becomes its failure reason. With `ray` (`--ray [ADDRESS]`), each model is
a task on a Ray cluster instead, placed on a node of its target (`infercc.ci.cluster`).
Benchmarks run after all models are built,
one at a time (in a separate process when `jobs > 1`), so timings are not taken on a machine
busy compiling other models.

A bad manifest raises `InferccError` (exit 2); a failed model makes `CiReport.passed` false
(exit 1). Reports: `CiReport.to_dict()` (JSON), JUnit XML (one testcase per model, a
`failure` element with the reason), and Markdown (appended to `$GITHUB_STEP_SUMMARY`).
"""
