"""TensorRT engine building for infercc's tensorrt backend (`infercc.backends.trt.backend`).

Modules: `settings` (builder settings from `CompileOptions.tensorrt`), `fingerprint` (what an
engine is tied to), `profiles` (optimization profiles), `precision` (TensorRT 10 vs 11 and
layer precisions read back), `calibrator` (INT8 from a calibration cache on TensorRT 10),
`caches` (timing and engine caches), `build` (the build flow and the artifact), `runner`
(running an engine), `versions` (which TensorRT majors each part runs on). Nothing here
imports tensorrt: the module is passed in.
"""
