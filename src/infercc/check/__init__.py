"""Proof that a rewrite is correct: output comparison under onnxruntime, candidates (models and
artifacts), goldens, tolerances, and bisection to the pass, rewrite and node that broke one."""
